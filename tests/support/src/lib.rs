//! Test support for pgkube's integration tests.
