//! The instance manager's allocator setting.
//!
//! glibc raises its mmap threshold each time a large block is freed (up to 32 MiB). After the
//! first few WAL files, the archiver's multi-MiB buffers would come from the heap arenas, which
//! keep what is freed: the process would hold the high-water mark of every upload at once. A
//! fixed threshold keeps each large buffer in a mapping of its own, returned when it is freed.
//! musl's allocator (the static release binary's) already maps every large block on its own
//! and has no such setting, so there this does nothing.

/// Blocks from this size on get their own mapping (glibc's default before it adjusts).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 128 * 1024;

/// Fixes the allocator's mmap threshold; call it before any thread starts.
pub fn keep_large_buffers_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets one of glibc's allocator parameters, and runs before the
        // process starts any other thread.
        let applied = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
        if applied != 1 {
            tracing::warn!("the allocator's mmap threshold could not be set");
        }
    }
}
