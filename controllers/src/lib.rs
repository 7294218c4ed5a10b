//! pgkube controllers.
