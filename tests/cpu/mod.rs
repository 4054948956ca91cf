//! Tests that need neither NVRTC nor a GPU.

mod bench_plots;
mod cache;
mod choice;
mod cli_export;
mod cli_long_values;
mod cli_robustness;
mod cli_show;
mod cli_tune;
mod cli_validate;
mod compile_missing_library;
mod decision;
mod decision_properties;
mod json_output_proptest;
mod launch;
mod nccl_library;
mod package;
mod reader_proptest;
mod reference;
mod reference_kernels_on_host;
mod robustness;
mod schemas;
mod select;
mod shipped_ladders;
mod validate_fixtures;
mod validate_memory;
mod validate_proptest;
