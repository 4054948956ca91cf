//! Devices and the rules a package must pass on one: architecture, cluster launch and SM count
//! at package level.
