//! `tenet-sys`: the machine under tenet. Read-only file mappings, buffers that fault in as huge
//! pages and the counting allocator tests bound memory with (`memory`); the process's thread
//! pool and the parallel parts every multi-threaded kernel and step runs on (`parallel`).
//!
//! Like `tenet-kernels`, it holds `unsafe` code (system calls, the pool's shared job slot)
//! behind safe functions, each block with a `// SAFETY:` line. It computes nothing: which
//! thread runs a part never decides a bit.

pub mod memory;
pub mod parallel;
