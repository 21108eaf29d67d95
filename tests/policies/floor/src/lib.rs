//! The floor of what a reconcile costs through the node contract: a module that decides nothing
//! (admit all, the given order, one pull at a time, no pause) and imports nothing but the
//! contract's own interfaces.
//!
//! It is `no_std`: Rust's standard library brings WASI with it (its panic path reads the
//! environment and writes to stderr), and every imported interface is a core instance and a set
//! of lowered functions that each instantiation pays for. Its allocator bumps a pointer through
//! the heap and starts over once every block is freed. `pinset policy bench --policy`
//! on this module measures what the contract itself costs — a fresh instance and the crossing
//! of each hook's arguments — against the native reference policy (BENCHMARKS.md, "The floor").

#![cfg_attr(target_arch = "wasm32", no_std)]

#[cfg(target_arch = "wasm32")]
mod guest {
    extern crate alloc;

    use alloc::string::String;
    use alloc::vec::Vec;
    use core::alloc::{GlobalAlloc, Layout};
    use core::arch::wasm32;

    wit_bindgen::generate!({ path: "../../../wit/policy.wit", world: "policy" });

    use exports::pinset::policy::decisions::Guest;
    use pinset::policy::types::{
        Admission, AdmissionRequest, Images, NodeFacts, PolicyInfo, Pressure, PullOutcome, Verdict,
    };

    struct Floor;

    impl Guest for Floor {
        fn info() -> PolicyInfo {
            PolicyInfo {
                name: "floor".into(),
                version: "0.1.0".into(),
                description: "decides nothing: the cost of the contract alone".into(),
            }
        }
        fn admit(_request: AdmissionRequest) -> Admission {
            Admission {
                verdict: Verdict::AdmitAll,
                reason: String::from("floor"),
            }
        }
        fn order(_node: NodeFacts, images: Images) -> Vec<u32> {
            (0..images.present.len() as u32).collect()
        }
        fn concurrency(_node: NodeFacts) -> u32 {
            1
        }
        fn throttle(_node: NodeFacts, _outcome: PullOutcome, _pressure: Pressure) -> u64 {
            0
        }
    }

    export!(Floor);

    /// A bump allocator over the linear memory after the data (`__heap_base`), growing the memory
    /// when it runs out. Memory is reused only once every block is freed (after each hook's
    /// post-return, when the arguments and the answer are gone).
    struct Bump;

    static mut NEXT: usize = 0;
    static mut LIVE: usize = 0;

    unsafe extern "C" {
        static __heap_base: u8;
    }

    const PAGE: usize = 65536;

    unsafe impl GlobalAlloc for Bump {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: a component instance runs one call at a time on one thread.
            unsafe {
                if NEXT == 0 {
                    NEXT = &raw const __heap_base as usize;
                }
                let start = NEXT.next_multiple_of(layout.align());
                let Some(end) = start.checked_add(layout.size()) else {
                    return core::ptr::null_mut();
                };
                let have = wasm32::memory_size(0) * PAGE;
                if end > have && wasm32::memory_grow(0, (end - have).div_ceil(PAGE)) == usize::MAX {
                    return core::ptr::null_mut();
                }
                NEXT = end;
                LIVE += 1;
                start as *mut u8
            }
        }

        unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {
            // SAFETY: as above.
            unsafe {
                LIVE = LIVE.saturating_sub(1);
                if LIVE == 0 {
                    NEXT = 0;
                }
            }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Bump = Bump;

    /// The canonical ABI's allocator export (the standard library's C runtime provides it for
    /// other policies).
    #[unsafe(no_mangle)]
    unsafe extern "C" fn cabi_realloc(
        old: *mut u8,
        old_len: usize,
        align: usize,
        new_len: usize,
    ) -> *mut u8 {
        if new_len == 0 {
            return align as *mut u8;
        }
        // SAFETY: the host passes a power-of-two alignment and, when `old_len` > 0, a block this
        // allocator returned with that layout.
        unsafe {
            let layout = Layout::from_size_align_unchecked(new_len, align);
            let new = ALLOCATOR.alloc(layout);
            if old_len > 0 && !new.is_null() {
                core::ptr::copy_nonoverlapping(old, new, old_len.min(new_len));
                ALLOCATOR.dealloc(old, Layout::from_size_align_unchecked(old_len, align));
            }
            new
        }
    }

    #[panic_handler]
    fn panic(_: &core::panic::PanicInfo) -> ! {
        wasm32::unreachable()
    }
}
