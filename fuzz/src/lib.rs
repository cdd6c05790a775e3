//! What each fuzz target shares: the entry point libFuzzer calls.

/// Defines libFuzzer's entry point to run `$body` on each input. A panic in it aborts the
/// process, which libFuzzer reports as a crash with the input that caused it.
#[macro_export]
macro_rules! fuzz_target {
    (|$data:ident| $body:block) => {
        /// Called by libFuzzer with each input.
        ///
        /// # Safety
        /// libFuzzer passes `size` readable bytes at `data` (or a null pointer with size 0).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn LLVMFuzzerTestOneInput(data: *const u8, size: usize) -> i32 {
            let input: &[u8] = if size == 0 {
                &[]
            } else {
                // SAFETY: as libFuzzer promises above.
                unsafe { std::slice::from_raw_parts(data, size) }
            };
            let run = |$data: &[u8]| $body;
            run(input);
            0
        }
    };
}
