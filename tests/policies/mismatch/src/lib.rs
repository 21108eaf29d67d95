//! Exports `pinset:policy/decisions@0.1.0` from a WIT whose `images` record has one more column
//! (`priority`) than the host's: the host must refuse it when it loads, naming the hook and the
//! field, not fall back on every call.

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({ path: "wit", world: "policy" });

    use exports::pinset::policy::decisions::Guest;
    use pinset::policy::types::*;

    struct Mismatch;

    impl Guest for Mismatch {
        fn info() -> PolicyInfo {
            PolicyInfo {
                name: "mismatch".into(),
                version: "0".into(),
                description: "images with a priority column".into(),
            }
        }
        fn admit(_: AdmissionRequest) -> Admission {
            Admission {
                verdict: Verdict::AdmitAll,
                reason: "mismatch".into(),
            }
        }
        fn order(_: NodeFacts, images: Images) -> Vec<u32> {
            (0..images.present.len() as u32).collect()
        }
        fn concurrency(_: NodeFacts) -> u32 {
            1
        }
        fn throttle(_: NodeFacts, _: PullOutcome, _: Pressure) -> u64 {
            0
        }
    }

    export!(Mismatch);
}
