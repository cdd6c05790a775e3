//! Counting the GPU's kernel launches (`smolchat bench --profile-dispatches`).
//!
//! A small model's decode step on the GPU is bound by how many kernels it launches, not by
//! arithmetic: each launch pays a fixed cost, however little it computes. CubeCL tells an
//! observer of every launch on the thread that issues it, named as the kernel names itself,
//! which is what says where the launches come from.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use burn::cubecl::config::{TypeNameFormatLevel, type_name_format};
use burn::cubecl::logging::{LaunchObservation, LaunchObserver};

/// Launches by kernel name, while the returned guard lives.
#[derive(Default)]
pub struct LaunchCounts {
    by_kernel: Mutex<BTreeMap<&'static str, usize>>,
}

impl LaunchObserver for LaunchCounts {
    fn launched(&self, kernel: &'static str) {
        let mut counts = self
            .by_kernel
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *counts.entry(kernel).or_default() += 1;
    }
}

impl LaunchCounts {
    /// Counts every launch in the process until the guard drops.
    pub fn observe() -> (Arc<Self>, LaunchObservation) {
        let counts = Arc::new(Self::default());
        let guard = LaunchObservation::new(counts.clone());
        (counts, guard)
    }

    pub fn total(&self) -> usize {
        self.by_kernel().values().sum()
    }

    /// Kernel names, without their paths and type parameters, with their counts.
    pub fn by_kernel(&self) -> BTreeMap<String, usize> {
        let mut named = BTreeMap::new();
        let counts = self
            .by_kernel
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (kernel, count) in counts.iter() {
            *named
                .entry(type_name_format(kernel, TypeNameFormatLevel::Short))
                .or_default() += count;
        }
        named
    }
}
