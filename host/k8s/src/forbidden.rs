//! A request the API server refused for lack of rights (HTTP 403) is said as what it is — who
//! may not do what, and where the right is granted — not as an outage. Every caller keeps
//! retrying on its own backoff: RBAC is often fixed after the install.

/// `forbidden: IDENTITY may not VERB RESOURCE (GROUP)` and where to grant it, when `e` (or one
/// of its sources) is a 403 from the API server; `None` for any other error. Callers say what
/// they do about it (retry on their backoff; a command exits 1).
pub fn refusal(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(kube::Error::Api(response)) = err.downcast_ref::<kube::Error>()
            && response.code == 403
        {
            return Some(describe(&response.message));
        }
        current = err.source();
    }
    None
}

/// The server's words (`User "U" cannot VERB resource "R" in API group "G" …`) restated, or as
/// they are when they do not read that way.
fn describe(message: &str) -> String {
    let quoted = |after: &str| -> Option<String> {
        let rest = &message[message.find(after)? + after.len()..];
        let rest = rest.strip_prefix('"')?;
        Some(rest[..rest.find('"')?].to_string())
    };
    let verb = message.find("\" cannot ").and_then(|at| {
        let rest = &message[at + "\" cannot ".len()..];
        rest.split_whitespace().next().map(String::from)
    });
    match (quoted("User "), verb, quoted("resource ")) {
        (Some(user), Some(verb), Some(resource)) => {
            let group = quoted("API group ")
                .filter(|g| !g.is_empty())
                .unwrap_or("core".into());
            format!(
                "forbidden: {user} may not {verb} {resource} ({group}); grant it in pinset's ClusterRole (deploy/base/rbac.yaml)"
            )
        }
        _ => format!("forbidden: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden(message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "Forbidden")
                .with_code(403)
                .boxed(),
        )
    }

    #[test]
    fn a_refusal_names_who_may_not_do_what() {
        let e = forbidden(
            r#"machineconfignodes.machineconfiguration.openshift.io "w-0" is forbidden: User "system:serviceaccount:pinset:pinset-agent" cannot patch resource "machineconfignodes/status" in API group "machineconfiguration.openshift.io" at the cluster scope: no rule allows it"#,
        );
        assert_eq!(
            refusal(&e).unwrap(),
            "forbidden: system:serviceaccount:pinset:pinset-agent may not patch machineconfignodes/status (machineconfiguration.openshift.io); grant it in pinset's ClusterRole (deploy/base/rbac.yaml)"
        );
        let core = forbidden(
            r#"nodes "w-0" is forbidden: User "u" cannot get resource "nodes" in API group "" at the cluster scope"#,
        );
        assert!(
            refusal(&core)
                .unwrap()
                .contains("u may not get nodes (core)")
        );
        let odd = forbidden("not allowed");
        assert_eq!(refusal(&odd).unwrap(), "forbidden: not allowed");
        let other = kube::Error::Api(
            kube::core::Status::failure("gone", "NotFound")
                .with_code(404)
                .boxed(),
        );
        assert_eq!(refusal(&other), None);
    }
}
