//! `Domain::find` runs on every request: it must not allocate. A counting allocator
//! (per thread, so the test harness's own threads do not interfere) checks it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use sluice::policy::parse_str;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn find_does_not_allocate() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    value: x*y*z\n    share_threshold: true\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    value: exact\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 3}\n";
    let docs = parse_str("alloc.yaml", text).unwrap();
    let policy = sluice::policy::compile(docs).unwrap();
    let domain = policy.domain("d").unwrap();
    let requests: [&[(&str, &str)]; 4] = [
        &[("a", "x1y2z"), ("b", "v")],
        &[("a", "exact")],
        &[("a", "other")],
        &[("a", "x1y2z"), ("b", "v"), ("c", "w")],
    ];
    let before = allocations();
    let found: [Option<usize>; 4] = [
        domain.find(requests[0]),
        domain.find(requests[1]),
        domain.find(requests[2]),
        domain.find(requests[3]),
    ];
    let after = allocations();
    assert_eq!(after - before, 0, "find allocated");
    // The counter does count.
    let boxed = std::hint::black_box(Box::new(1u64));
    assert!(allocations() > after);
    drop(boxed);
    assert!(found[..3].iter().all(Option::is_some));
    assert_eq!(found[3], None);
}
