//! Built against `pinset:fleet@0.2.0` (its WIT kept in `wit/`), which exports `grant` but not
//! `decide` (added in 0.2.1): a module built before the addition keeps loading and is asked
//! `grant`. It grants the first node of the pool.

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({ path: "wit", world: "fleet-policy" });

    use exports::pinset::fleet::rollout::Guest;
    use pinset::fleet::types::{PolicyInfo, RolloutGrant, RolloutRequest};

    struct Old;

    impl Guest for Old {
        fn info() -> PolicyInfo {
            PolicyInfo {
                name: "fleet-0.2.0".into(),
                version: "0.2.0".into(),
                description: "built for pinset:fleet@0.2.0".into(),
            }
        }

        fn grant(request: RolloutRequest) -> RolloutGrant {
            let nodes = if request.nodes.names.is_empty() {
                vec![]
            } else {
                vec![0]
            };
            RolloutGrant {
                nodes,
                max_pulls: None,
                reason: "built for 0.2.0: the first node".into(),
            }
        }
    }

    export!(Old);
}
