//! Asks Linux to back the weights with 2 MiB pages.
//!
//! A decode step streams every weight once, through tens of thousands of 4 KiB pages: the
//! page walks cost a fifth of the memory bandwidth (a matrix-vector product over 530 MB read
//! 37 GB/s with 4 KiB pages and 47 GB/s with huge pages on our 2-core machines). Many
//! distributions enable transparent huge pages only where a program asks (`madvise` mode),
//! so we ask.

/// Advises huge pages for the spare capacity of `buffer`, before it is first written: the
/// kernel then backs each aligned 2 MiB stretch with one page. Advice only; where it is not
/// supported, nothing changes.
pub fn advise_for_capacity<T>(buffer: &mut Vec<T>) {
    #[cfg(target_os = "linux")]
    {
        const HUGE_PAGE: usize = 2 << 20;
        let spare = buffer.spare_capacity_mut();
        let start = spare.as_mut_ptr() as usize;
        let end = start + std::mem::size_of_val(spare);
        let aligned_start = start.next_multiple_of(HUGE_PAGE);
        let aligned_end = end / HUGE_PAGE * HUGE_PAGE;
        if aligned_end > aligned_start {
            // SAFETY: the range lies inside this vector's own allocation, and MADV_HUGEPAGE
            // changes only how the kernel backs it, never its contents or its validity.
            unsafe {
                libc::madvise(
                    aligned_start as *mut libc::c_void,
                    aligned_end - aligned_start,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buffer;
}
