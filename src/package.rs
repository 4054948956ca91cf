//! Packages: the ladder, compiled kernels and a manifest that describes and hashes them.
