//! What the readers allocate for a reply that has not all arrived: no more than its
//! bytes so far could fill, whatever its header declares. A test binary of its own,
//! to count every allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use sluice_redis::connection::parse;
use sluice_redis::value;

/// The system allocator, remembering the largest allocation asked of it.
struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on as it came.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: allocated by `System` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

#[test]
fn a_header_that_declares_millions_of_items_reserves_only_what_arrived() {
    // 16 Mi integers declared (128 MiB as i64s), one sent.
    let head = b"*16777216\r\n:1\r\n";
    LARGEST.store(0, Ordering::Relaxed);
    assert_eq!(parse(head).unwrap(), None);
    assert_eq!(value::parse(head).unwrap(), None);
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(largest < 4096, "{largest} bytes allocated at once");
}
