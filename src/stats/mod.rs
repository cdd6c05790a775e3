//! Measurements shown to the user and printed by `smolchat bench`.

pub mod dispatches;
pub mod memory;
pub mod summary;
