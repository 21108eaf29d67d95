//! The runtime of a policy built without Rust's standard library (feature `no-std`, wasm32
//! only): its allocator and its panic handler.
//!
//! An instance lives for one reconcile (a handful of calls), so the allocator bumps a pointer
//! through the linear memory after the data and starts over once every block is freed — after
//! each call's post-return, when the arguments and the answer are gone. It grows the memory only
//! past what the module starts with, and never returns it (the instance is dropped soon). The
//! last block grows in place.
//! A policy that keeps blocks between calls of one reconcile only stops the reuse: memory then
//! grows with each call, within the instance's cap.
//!
//! A panic is written to pinset's log through the contract (`panicked at FILE:LINE: MESSAGE`,
//! which pinset quotes in the error of the failed call), then traps.

use core::alloc::{GlobalAlloc, Layout};
use core::arch::wasm32;
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, Ordering};

const PAGE: usize = 65536;

struct Bump;

/// The next free byte (0 before the first allocation), and the blocks not yet freed.
static mut NEXT: usize = 0;
static mut LIVE: usize = 0;

unsafe extern "C" {
    /// The first byte after the module's data and stack, set by the linker.
    static __heap_base: u8;
}

/// Make the linear memory reach `end`, growing it if needed; false when it cannot grow.
fn reach(end: usize) -> bool {
    let have = wasm32::memory_size(0) * PAGE;
    end <= have || wasm32::memory_grow(0, (end - have).div_ceil(PAGE)) != usize::MAX
}

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
            if !reach(end) {
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

    /// The last block (a growing `Vec` or `String`, the host's arguments) grows or shrinks where
    /// it is; any other is copied to a new block.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above; `ptr` is a live block of `layout` (GlobalAlloc's contract), and
        // blocks are handed out in address order, so only the last one ends at `NEXT`.
        unsafe {
            let start = ptr as usize;
            if start + layout.size() == NEXT {
                let Some(end) = start.checked_add(new_size) else {
                    return core::ptr::null_mut();
                };
                if !reach(end) {
                    return core::ptr::null_mut();
                }
                NEXT = end;
                return ptr;
            }
            let new = self.alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
            if !new.is_null() {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

#[global_allocator]
static ALLOCATOR: Bump = Bump;

/// The canonical ABI's allocator export, through which the host writes a call's arguments
/// (with the standard library, its C runtime provides it).
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
        if old_len == 0 {
            return ALLOCATOR.alloc(layout);
        }
        ALLOCATOR.realloc(
            old,
            Layout::from_size_align_unchecked(old_len, align),
            new_len,
        )
    }
}

/// A panic message cut to a fixed buffer: the handler allocates nothing (the panic may be the
/// allocator's).
struct Line {
    bytes: [u8; 512],
    len: usize,
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let room = self.bytes.len() - self.len;
        // Cut on a character boundary.
        let mut take = s.len().min(room);
        while !s.is_char_boundary(take) {
            take -= 1;
        }
        self.bytes[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        Ok(())
    }
}

/// Set by the first panic: a panic while logging it traps at once.
static PANICKING: AtomicBool = AtomicBool::new(false);

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    if !PANICKING.swap(true, Ordering::Relaxed) {
        let mut line = Line {
            bytes: [0; 512],
            len: 0,
        };
        let _ = match info.location() {
            Some(at) => write!(
                line,
                "panicked at {}:{}: {}",
                at.file(),
                at.line(),
                info.message()
            ),
            None => write!(line, "panicked: {}", info.message()),
        };
        if let Ok(text) = core::str::from_utf8(&line.bytes[..line.len]) {
            crate::log(crate::Level::Error, text);
        }
    }
    wasm32::unreachable()
}
