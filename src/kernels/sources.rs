//! The kernel sources and the headers they include, embedded in the binary for NVRTC.

use super::spec::KernelSpec;

/// The kernel sources, by file name.
const SOURCES: [(&str, &str); 15] = [
    (
        "add_rms_norm.cu",
        include_str!("../../kernels/add_rms_norm.cu"),
    ),
    ("all_gather.cu", include_str!("../../kernels/all_gather.cu")),
    (
        "all_gather_double_buffered.cu",
        include_str!("../../kernels/all_gather_double_buffered.cu"),
    ),
    (
        "all_reduce_add_rms_norm_one_shot.cu",
        include_str!("../../kernels/all_reduce_add_rms_norm_one_shot.cu"),
    ),
    (
        "all_reduce_add_rms_norm_two_shot.cu",
        include_str!("../../kernels/all_reduce_add_rms_norm_two_shot.cu"),
    ),
    (
        "all_reduce_full_phased.cu",
        include_str!("../../kernels/all_reduce_full_phased.cu"),
    ),
    (
        "all_reduce_one_shot.cu",
        include_str!("../../kernels/all_reduce_one_shot.cu"),
    ),
    (
        "all_reduce_one_shot_copy_engine.cu",
        include_str!("../../kernels/all_reduce_one_shot_copy_engine.cu"),
    ),
    (
        "all_reduce_one_shot_double_buffered.cu",
        include_str!("../../kernels/all_reduce_one_shot_double_buffered.cu"),
    ),
    (
        "all_reduce_rsag.cu",
        include_str!("../../kernels/all_reduce_rsag.cu"),
    ),
    (
        "all_reduce_rsag_double_buffered.cu",
        include_str!("../../kernels/all_reduce_rsag_double_buffered.cu"),
    ),
    (
        "all_reduce_rsag_phased.cu",
        include_str!("../../kernels/all_reduce_rsag_phased.cu"),
    ),
    (
        "nccl_rank_order_sum.cu",
        include_str!("../../kernels/nccl_rank_order_sum.cu"),
    ),
    (
        "reduce_scatter.cu",
        include_str!("../../kernels/reduce_scatter.cu"),
    ),
    (
        "reduce_scatter_double_buffered.cu",
        include_str!("../../kernels/reduce_scatter_double_buffered.cu"),
    ),
];

/// The headers the sources include, by the name they are included as.
const HEADERS: [(&str, &str); 11] = [
    (
        "prepare_abi.cuh",
        include_str!("../../kernels/prepare_abi.cuh"),
    ),
    (
        "prepare_cluster.cuh",
        include_str!("../../kernels/prepare_cluster.cuh"),
    ),
    (
        "prepare_copy_engine.cuh",
        include_str!("../../kernels/prepare_copy_engine.cuh"),
    ),
    (
        "prepare_double_buffer.cuh",
        include_str!("../../kernels/prepare_double_buffer.cuh"),
    ),
    (
        "prepare_element.cuh",
        include_str!("../../kernels/prepare_element.cuh"),
    ),
    (
        "prepare_entry.cuh",
        include_str!("../../kernels/prepare_entry.cuh"),
    ),
    (
        "prepare_layout.cuh",
        include_str!("../../kernels/prepare_layout.cuh"),
    ),
    (
        "prepare_norm.cuh",
        include_str!("../../kernels/prepare_norm.cuh"),
    ),
    (
        "prepare_phases.cuh",
        include_str!("../../kernels/prepare_phases.cuh"),
    ),
    (
        "prepare_phases_simple.cuh",
        include_str!("../../kernels/prepare_phases_simple.cuh"),
    ),
    (
        "prepare_sync.cuh",
        include_str!("../../kernels/prepare_sync.cuh"),
    ),
];

/// The CUDA source of a kernel, embedded in the binary.
pub fn source(spec: &KernelSpec) -> &'static str {
    SOURCES
        .iter()
        .find(|(file, _)| *file == spec.source)
        .map_or_else(
            || panic!("`{}` is not a kernel source of this crate", spec.source),
            |(_, text)| *text,
        )
}

/// The headers every source may include, as (include name, text), for NVRTC's named headers.
pub fn headers() -> &'static [(&'static str, &'static str)] {
    &HEADERS
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::spec::all_kernels;
    use crate::ladder::Dtype;

    #[test]
    fn every_kernel_is_defined_in_its_source_and_every_include_is_a_header() {
        for spec in all_kernels(Dtype::Bf16, 2) {
            let text = source(&spec);
            let base = spec.name.strip_suffix("_bf16").unwrap();
            let shape = if spec.cluster {
                "cluster_kernel"
            } else if spec.source == "nccl_rank_order_sum.cu" {
                // Local memory only: no flags, no peers, no state required.
                "local_kernel"
            } else if spec.source == "add_rms_norm.cu" {
                // The same, with the epilogue's checks.
                "epilogue_kernel"
            } else if spec.source.starts_with("all_reduce_add_rms_norm_") {
                // Block kernels with the epilogue's checks.
                "fused_kernel"
            } else if spec.name.starts_with("reduce_scatter_")
                || spec.name.starts_with("all_gather_")
            {
                // The row collectives check their shape when they begin.
                "row_kernel"
            } else {
                "block_kernel"
            };
            assert!(
                text.contains(&format!("PREPARE_ENTRY({base}, {shape}, ")),
                "{} does not define {base} as a {shape}",
                spec.source,
            );
            let uses_cluster = text.contains("prepare_cluster.cuh");
            assert_eq!(uses_cluster, spec.cluster, "{}", spec.name);
        }
        let header_names: Vec<&str> = headers().iter().map(|(name, _)| *name).collect();
        let texts = SOURCES.iter().chain(HEADERS.iter());
        for (file, text) in texts {
            for line in text.lines() {
                if let Some(include) = line.strip_prefix("#include ") {
                    let name = include.trim_matches('"');
                    assert!(
                        header_names.contains(&name),
                        "{file} includes {name}, which is not a named header"
                    );
                }
            }
        }
    }
}
