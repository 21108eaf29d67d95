//! An authorizer for the test API server that decides every request from RBAC objects — the
//! ClusterRoles, Roles and bindings rendered from `deploy/` — the way Kubernetes' RBAC
//! authorizer does, answering the server's `SubjectAccessReview`s (its
//! `--authorization-kubeconfig` points here). Every decision is recorded with the rule that
//! allowed it, so a test can see which rules were used and which requests were refused.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One rule of a role: `role` names it, `index` is its place among the role's rules.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RuleId {
    pub role: String,
    pub index: usize,
}

/// What a request asks (a SubjectAccessReview's spec).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    pub user: String,
    pub groups: Vec<String>,
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub namespace: String,
    /// A non-resource request's path (`/apis`, `/openapi/v3`…).
    pub path: String,
}

impl Request {
    /// `verb resource[/subresource] [name]` as Kubernetes says it in a refusal.
    pub fn describe(&self) -> String {
        if !self.path.is_empty() {
            return format!("{} {} by {}", self.verb, self.path, self.user);
        }
        let sub = match self.subresource.as_str() {
            "" => String::new(),
            s => format!("/{s}"),
        };
        format!(
            "{} {}{sub}.{} {} by {}",
            self.verb, self.resource, self.group, self.name, self.user
        )
    }
}

/// A decision: the request, and the rule that allowed it (`None`: refused).
#[derive(Clone, Debug)]
pub struct Decision {
    pub request: Request,
    pub allowed_by: Option<RuleId>,
}

/// Roles and bindings, as RBAC reads them.
#[derive(Clone, Debug, Default)]
pub struct Rbac {
    /// (kind/namespace/name of the role, its rules).
    roles: Vec<(String, Vec<Value>)>,
    /// (role key, subjects, namespace of a RoleBinding).
    bindings: Vec<(String, Vec<Value>, Option<String>)>,
}

impl Rbac {
    /// The RBAC objects among `docs` (any other kind is skipped).
    pub fn from_docs(docs: &[Value]) -> Rbac {
        let mut rbac = Rbac::default();
        for doc in docs {
            let kind = doc["kind"].as_str().unwrap_or_default();
            let name = doc["metadata"]["name"].as_str().unwrap_or_default();
            let ns = doc["metadata"]["namespace"].as_str();
            match kind {
                "ClusterRole" | "Role" => {
                    let rules = doc["rules"].as_array().cloned().unwrap_or_default();
                    rbac.roles.push((role_key(kind, ns, name), rules));
                }
                "ClusterRoleBinding" | "RoleBinding" => {
                    let r = &doc["roleRef"];
                    let role_kind = r["kind"].as_str().unwrap_or_default();
                    let role_ns = (role_kind == "Role").then_some(ns).flatten();
                    let key = role_key(role_kind, role_ns, r["name"].as_str().unwrap_or_default());
                    let subjects = doc["subjects"].as_array().cloned().unwrap_or_default();
                    let scope = (kind == "RoleBinding").then(|| ns.unwrap_or_default().to_string());
                    rbac.bindings.push((key, subjects, scope));
                }
                _ => {}
            }
        }
        rbac
    }

    /// The manifests as `kubectl kustomize DIR` renders them; `None` without kubectl.
    pub fn render(dir: &Path) -> Option<Rbac> {
        let out = std::process::Command::new("kubectl")
            .arg("kustomize")
            .arg(dir)
            .output()
            .ok()?;
        assert!(
            out.status.success(),
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(Rbac::from_yaml(&String::from_utf8(out.stdout).unwrap()))
    }

    /// The manifests of `dir` with `components` (directories) added, as a kustomization of
    /// one's own that names them renders them; `None` without kubectl.
    pub fn render_with(dir: &Path, components: &[&Path]) -> Option<Rbac> {
        let own = tempfile::tempdir().expect("a scratch directory");
        // kustomize takes relative paths only: up to the root, then down to each directory.
        let root = "../".repeat(own.path().components().count() - 1);
        let relative = |p: &Path| format!("{root}{}", p.strip_prefix("/").unwrap_or(p).display());
        let listed = |ps: &[&Path]| {
            ps.iter()
                .map(|p| format!("  - {}\n", relative(p)))
                .collect::<String>()
        };
        let text = format!(
            "resources:\n{}components:\n{}",
            listed(&[dir]),
            listed(components)
        );
        std::fs::write(own.path().join("kustomization.yaml"), text).expect("a kustomization");
        Rbac::render(own.path())
    }

    pub fn from_yaml(text: &str) -> Rbac {
        let docs: Vec<Value> = serde_saphyr::from_multiple::<Option<Value>>(text)
            .expect("kubectl kustomize prints YAML")
            .into_iter()
            .flatten()
            .filter(|d| !d.is_null())
            .collect();
        Rbac::from_docs(&docs)
    }

    /// Every rule, for "is each one used".
    pub fn rules(&self) -> Vec<(RuleId, Value)> {
        self.roles
            .iter()
            .flat_map(|(role, rules)| {
                rules.iter().enumerate().map(|(index, rule)| {
                    let id = RuleId {
                        role: role.clone(),
                        index,
                    };
                    (id, rule.clone())
                })
            })
            .collect()
    }

    /// Also bind the ClusterRole `role` to `user` (as an operator would, for people).
    pub fn with_binding(mut self, role: &str, user: &str) -> Rbac {
        let subject = json!({"kind": "User", "name": user});
        self.bindings
            .push((role_key("ClusterRole", None, role), vec![subject], None));
        self
    }

    /// Drop rule `index` of `role` (a test that removes one rule).
    pub fn without(&self, id: &RuleId) -> Rbac {
        let mut out = self.clone();
        for (role, rules) in &mut out.roles {
            if *role == id.role && id.index < rules.len() {
                // Keep the indexes of the others: an empty rule matches nothing.
                rules[id.index] = json!({});
            }
        }
        out
    }

    /// The rule that allows `r`, if one does.
    pub fn allows(&self, r: &Request) -> Option<RuleId> {
        for (role, subjects, scope) in &self.bindings {
            if !subjects.iter().any(|s| subject_matches(s, r)) {
                continue;
            }
            if let Some(ns) = scope
                && *ns != r.namespace
            {
                continue;
            }
            let Some((_, rules)) = self.roles.iter().find(|(k, _)| k == role) else {
                continue;
            };
            if let Some(index) = rules.iter().position(|rule| rule_matches(rule, r)) {
                return Some(RuleId {
                    role: role.clone(),
                    index,
                });
            }
        }
        None
    }
}

fn role_key(kind: &str, ns: Option<&str>, name: &str) -> String {
    match ns {
        Some(ns) if kind == "Role" => format!("Role {ns}/{name}"),
        _ => format!("{kind} {name}"),
    }
}

fn subject_matches(s: &Value, r: &Request) -> bool {
    let name = s["name"].as_str().unwrap_or_default();
    match s["kind"].as_str().unwrap_or_default() {
        "User" => r.user == name,
        "Group" => r.groups.iter().any(|g| g == name),
        "ServiceAccount" => {
            let ns = s["namespace"].as_str().unwrap_or_default();
            r.user == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn listed(rule: &Value, field: &str, value: &str) -> bool {
    rule[field]
        .as_array()
        .is_some_and(|items| items.iter().any(|i| i == "*" || i == value))
}

fn rule_matches(rule: &Value, r: &Request) -> bool {
    if !listed(rule, "verbs", &r.verb) {
        return false;
    }
    if !r.path.is_empty() {
        return rule["nonResourceURLs"].as_array().is_some_and(|urls| {
            urls.iter()
                .filter_map(Value::as_str)
                .any(|u| u == r.path || u.strip_suffix('*').is_some_and(|p| r.path.starts_with(p)))
        });
    }
    let resource = match r.subresource.as_str() {
        "" => r.resource.clone(),
        sub => format!("{}/{sub}", r.resource),
    };
    let names_ok = match rule["resourceNames"].as_array() {
        Some(names) if !names.is_empty() => names.iter().any(|n| n == r.name.as_str()),
        _ => true,
    };
    listed(rule, "apiGroups", &r.group) && listed(rule, "resources", &resource) && names_ok
}

/// The review's spec as a [`Request`].
pub fn request_of(review: &Value) -> Request {
    let spec = &review["spec"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let groups = spec["groups"]
        .as_array()
        .map(|g| g.iter().map(text).collect())
        .unwrap_or_default();
    let (res, non) = (&spec["resourceAttributes"], &spec["nonResourceAttributes"]);
    let verb = if res.is_object() {
        &res["verb"]
    } else {
        &non["verb"]
    };
    Request {
        user: text(&spec["user"]),
        groups,
        verb: text(verb),
        group: text(&res["group"]),
        resource: text(&res["resource"]),
        subresource: text(&res["subresource"]),
        name: text(&res["name"]),
        namespace: text(&res["namespace"]),
        path: text(&non["path"]),
    }
}

/// The authorizer, serving on a loopback port until the process ends.
#[derive(Clone)]
pub struct Authorizer {
    pub url: String,
    rbac: Arc<Mutex<Rbac>>,
    decisions: Arc<Mutex<Vec<Decision>>>,
    /// Users a test has refused on purpose: their refusals, whenever they land, are expected.
    refusable: Arc<Mutex<Vec<String>>>,
}

impl Authorizer {
    pub fn start(rbac: Rbac) -> Authorizer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let rbac = Arc::new(Mutex::new(rbac));
        let decisions = Arc::new(Mutex::new(Vec::new()));
        let (r, d) = (rbac.clone(), decisions.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (r, d) = (r.clone(), d.clone());
                std::thread::spawn(move || serve(stream, &r, &d));
            }
        });
        Authorizer {
            url,
            rbac,
            decisions,
            refusable: Default::default(),
        }
    }

    /// Decide `request` as for a review the API server sends (a front end that serves what the
    /// server does not, [`crate::core_api`]), the decision recorded with the others.
    pub fn decide(&self, request: Request) -> bool {
        decide(&request, &self.rbac, &self.decisions)
    }

    /// Decide from other rules from now on.
    pub fn set_rules(&self, rbac: Rbac) {
        *self.rbac.lock().unwrap() = rbac;
    }

    pub fn decisions(&self) -> Vec<Decision> {
        self.decisions.lock().unwrap().clone()
    }

    /// Every refusal of `user` is expected, however late it lands: a command refused on
    /// purpose stops at its first refusal while its other requests may still be in flight.
    pub fn may_refuse(&self, user: &str) {
        self.refusable.lock().unwrap().push(user.to_string());
    }

    /// The refusals no test asked for.
    pub fn unexpected_refusals(&self) -> Vec<Decision> {
        let refusable = self.refusable.lock().unwrap().clone();
        self.decisions()
            .into_iter()
            .filter(|d| d.allowed_by.is_none() && !refusable.contains(&d.request.user))
            .collect()
    }

    /// Forget the refusals recorded so far (a test that provoked them on purpose).
    pub fn forget_refusals(&self) {
        self.decisions
            .lock()
            .unwrap()
            .retain(|d| d.allowed_by.is_some());
    }

    /// A kubeconfig the API server reaches this authorizer with.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("authorizer.kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: rbac\n  cluster:\n    server: {}\nusers:\n- name: apiserver\n  user: {{}}\ncontexts:\n- name: rbac\n  context: {{cluster: rbac, user: apiserver}}\ncurrent-context: rbac\n",
                self.url
            ),
        )
        .unwrap();
        path
    }
}

/// Whether `request` is allowed: always for `system:masters` (the tests' own client), else by
/// the rules, the decision recorded.
fn decide(request: &Request, rbac: &Mutex<Rbac>, decisions: &Mutex<Vec<Decision>>) -> bool {
    if request.groups.iter().any(|g| g == "system:masters") {
        return true;
    }
    let allowed_by = rbac.lock().unwrap().allows(request);
    let allowed = allowed_by.is_some();
    decisions.lock().unwrap().push(Decision {
        request: request.clone(),
        allowed_by,
    });
    allowed
}

/// Answer the reviews of one connection.
fn serve(stream: std::net::TcpStream, rbac: &Mutex<Rbac>, decisions: &Mutex<Vec<Decision>>) {
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        let mut first = true;
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if first && line.trim().is_empty() {
                continue;
            }
            first = false;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let allowed = decide(&request_of(&review), rbac, decisions);
        let reason = match allowed {
            true => "allowed by the rendered RBAC".to_string(),
            false => "no rule of the rendered RBAC allows it".to_string(),
        };
        let answer = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "status": {"allowed": allowed, "reason": reason},
        })
        .to_string();
        let written = write!(
            writer,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if written.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RBAC: &str = "kind: ClusterRole\nmetadata: {name: agent}\nrules:\n- {apiGroups: [g], resources: [things], verbs: [get, list]}\n- {apiGroups: [g], resources: [things/status], verbs: [patch]}\n- {apiGroups: [p], resources: [configs], resourceNames: [cluster], verbs: [get]}\n---\nkind: ClusterRoleBinding\nmetadata: {name: agent}\nroleRef: {kind: ClusterRole, name: agent}\nsubjects: [{kind: ServiceAccount, name: agent, namespace: ns}]\n";

    fn ask(verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Request {
        Request {
            user: "system:serviceaccount:ns:agent".into(),
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn rules_decide_as_rbac_does() {
        let rbac = Rbac::from_yaml(RBAC);
        assert_eq!(
            rbac.allows(&ask("get", "g", "things", "", "a"))
                .unwrap()
                .index,
            0
        );
        assert_eq!(
            rbac.allows(&ask("patch", "g", "things", "status", "a"))
                .unwrap()
                .index,
            1
        );
        assert!(rbac.allows(&ask("patch", "g", "things", "", "a")).is_none());
        assert!(
            rbac.allows(&ask("get", "p", "configs", "", "other"))
                .is_none()
        );
        assert!(
            rbac.allows(&ask("get", "p", "configs", "", "cluster"))
                .is_some()
        );
        let mut stranger = ask("get", "g", "things", "", "a");
        stranger.user = "system:serviceaccount:ns:other".into();
        assert!(rbac.allows(&stranger).is_none());
        let id = rbac
            .allows(&ask("patch", "g", "things", "status", "a"))
            .unwrap();
        assert!(
            rbac.without(&id)
                .allows(&ask("patch", "g", "things", "status", "a"))
                .is_none()
        );
        assert_eq!(rbac.rules().len(), 3);
    }
}
