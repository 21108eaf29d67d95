//! Built against `pinset:fleet@0.3.0`, which this pinset does not implement.

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({ path: "wit", world: "fleet-policy" });

    struct Future;

    impl exports::pinset::fleet::rollout::Guest for Future {
        fn info() -> String {
            "future fleet".into()
        }
    }

    export!(Future);
}
