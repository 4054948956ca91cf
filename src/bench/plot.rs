//! SVG plots of a [`super::BenchReport`] (plotters, SVG backend only).
