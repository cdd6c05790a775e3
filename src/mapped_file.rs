//! Read-only file mappings that the model loaders read weights from.

use std::ops::Range;

use memmap2::{Mmap, UncheckedAdvice};

/// Hands the whole pages inside `bytes` of `map` back to the kernel once a loader has
/// converted what they hold, so that resident memory while loading stays near one copy of
/// the weights instead of growing by the whole file. Partial pages at either end stay, as
/// neighbouring data may still be read.
pub fn release_pages(map: &Mmap, bytes: Range<usize>) {
    let page = 4096;
    let first = bytes.start.div_ceil(page) * page;
    let last = bytes.end / page * page;
    if last > first {
        // SAFETY: the mapping is a read-only private file mapping; dropping its pages only
        // means a later read faults them in again from the file, and the callers hold no
        // slice into this range past the conversion that just finished.
        let _ =
            unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, first, last - first) };
    }
}
