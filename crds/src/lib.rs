//! pgkube API types, group `db.example.com`, version `v1alpha1`.
