//! Buffers that begin on a cache line, for the activations and sums the tiles read a vector
//! at a time. A `Vec` of floats begins 16 bytes into a line (glibc's allocations), so every
//! 64-byte load of it, and every other 32-byte one, spans two lines and costs two reads: a
//! 1.7B BF16 file's prompts ran 1.10–1.15× as fast natively, and 1.08–1.13× capped at AVX2,
//! once the tile's activations began on a line.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use bytemuck::Pod;

/// The bytes of one cache line on x86-64 (and the width of an AVX-512 vector).
const LINE_BYTES: usize = 64;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; LINE_BYTES]);

// SAFETY: a line is 64 bytes with no padding (its alignment is its size), and any bytes are
// a valid line.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above; it holds no pointers.
unsafe impl bytemuck::Pod for Line {}

/// `len` values of `T` from the start of a cache line; `T` is a plain number (`f32`, `u32`,
/// `i16`) whose size divides a line's.
pub struct CacheLines<T> {
    lines: Vec<Line>,
    len: usize,
    of: PhantomData<T>,
}

impl<T: Pod> CacheLines<T> {
    pub const fn new() -> Self {
        Self {
            lines: Vec::new(),
            len: 0,
            of: PhantomData,
        }
    }

    /// `len` zeros.
    pub fn zeroed(len: usize) -> Self {
        let mut buffer = Self::new();
        buffer.grow(len);
        buffer.len = len;
        buffer
    }

    /// A copy of `values`.
    pub fn copy_of(values: &[T]) -> Self {
        let mut buffer = Self::zeroed(values.len());
        buffer.copy_from_slice(values);
        buffer
    }

    /// The first `len` values, the buffer grown (with zeros) to hold them: per-thread
    /// buffers only grow, so they are zeroed once, not per use.
    pub fn first(&mut self, len: usize) -> &mut [T] {
        self.grow(len);
        self.len = self.len.max(len);
        &mut self[..len]
    }

    fn grow(&mut self, len: usize) {
        let lines = (len * size_of::<T>()).div_ceil(LINE_BYTES);
        if self.lines.len() < lines {
            self.lines.resize(lines, Line([0; LINE_BYTES]));
        }
    }
}

impl<T: Pod> Default for CacheLines<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Pod> Deref for CacheLines<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }
}

impl<T: Pod> DerefMut for CacheLines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::CacheLines;

    #[test]
    fn buffers_begin_on_a_line_and_hold_their_values() {
        let copy = CacheLines::copy_of(&[1.0_f32, 2.0, 3.0]);
        assert_eq!(copy.as_ptr() as usize % 64, 0);
        assert_eq!(*copy, [1.0, 2.0, 3.0]);
        let mut words = CacheLines::<i16>::zeroed(40);
        assert_eq!((words.len(), words.as_ptr() as usize % 64), (40, 0));
        assert!(words.iter().all(|&w| w == 0));
        words[39] = 7;
        // Growing keeps what the buffer held; asking for fewer leaves the rest.
        assert_eq!(words.first(100).len(), 100);
        assert_eq!((words[39], words.len()), (7, 100));
        assert_eq!(words.first(10).len(), 10);
        assert_eq!(words.len(), 100);
        assert_eq!(CacheLines::<u32>::new().len(), 0);
    }
}
