//! Built against `pinset:policy@0.2.0`, which this pinset does not implement.

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({ path: "wit", world: "policy" });

    struct Future;

    impl exports::pinset::policy::decisions::Guest for Future {
        fn info() -> String {
            "future".into()
        }
    }

    export!(Future);
}
