//! How two manifests differ, in words: what `prepare export` says when the package already at
//! its output is not the one it would write.

use std::collections::BTreeMap;

use super::manifest::Manifest;

/// The parts in which `existing` (a package's manifest) differs from `new` (what an export
/// writes), as phrases about the existing one ("it is for sm_90, this export for sm_120");
/// empty when the two describe the same package. The qualification and the checksum are not
/// compared: the qualification is a record of a run, which the caller compares as it needs.
pub fn manifest_differences(existing: &Manifest, new: &Manifest) -> Vec<String> {
    let mut differences = Vec::new();
    if (existing.format_version, &existing.tool_version) != (new.format_version, &new.tool_version)
    {
        differences.push(format!(
            "it was written by prepare {} (package format {}), this export by prepare {} \
             (package format {})",
            existing.tool_version, existing.format_version, new.tool_version, new.format_version
        ));
    }
    if existing.ladder != new.ladder {
        differences.push(format!(
            "its ladder is `{}` (sha256 {}), this export's `{}` (sha256 {})",
            crate::files::shorten(&existing.ladder.name),
            short(&existing.ladder.sha256),
            crate::files::shorten(&new.ladder.name),
            short(&new.ladder.sha256)
        ));
    }
    if existing.arch != new.arch {
        differences.push(format!(
            "it is for {}, this export for {}",
            existing.arch, new.arch
        ));
    }
    if existing.compiler.nvrtc_version != new.compiler.nvrtc_version {
        differences.push(format!(
            "it was compiled by NVRTC {}, this export by NVRTC {}",
            existing.compiler.nvrtc_version, new.compiler.nvrtc_version
        ));
    }
    if let Some(options) = option_differences(existing, new) {
        differences.push(options);
    }
    if let Some(kernels) = kernel_differences(existing, new) {
        differences.push(kernels);
    }
    // Buckets and peer memory follow from the ladder and the tool: named only where those do
    // not already say it.
    if differences.is_empty() && existing.buckets != new.buckets {
        differences.push("its buckets differ".to_owned());
    }
    if differences.is_empty() && existing.peer_memory != new.peer_memory {
        differences.push("its peer memory differs".to_owned());
    }
    differences
}

/// The compiler options only one side has, leaving out those that name the architecture when
/// that already differs.
fn option_differences(existing: &Manifest, new: &Manifest) -> Option<String> {
    let arches = [existing.arch.name(), new.arch.name()];
    let named = |option: &String| {
        existing.arch != new.arch && arches.iter().any(|arch| option.contains(arch))
    };
    let only = |from: &Manifest, other: &Manifest| -> Vec<String> {
        from.compiler
            .options
            .iter()
            .filter(|option| !other.compiler.options.contains(option) && !named(option))
            .map(|option| format!("`{option}`"))
            .collect()
    };
    let (there, here) = (only(existing, new), only(new, existing));
    if there.is_empty() && here.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    if !there.is_empty() {
        parts.push(format!("{} only there", there.join(" ")));
    }
    if !here.is_empty() {
        parts.push(format!("{} only in this export", here.join(" ")));
    }
    Some(format!("its compiler options differ: {}", parts.join(", ")))
}

/// The kernels whose cubins differ, or that only one side has, by name.
fn kernel_differences(existing: &Manifest, new: &Manifest) -> Option<String> {
    let theirs: BTreeMap<&str, _> = existing
        .kernels
        .iter()
        .map(|kernel| (kernel.name.as_str(), kernel))
        .collect();
    let ours: BTreeMap<&str, _> = new
        .kernels
        .iter()
        .map(|kernel| (kernel.name.as_str(), kernel))
        .collect();
    let mut names: Vec<&str> = theirs.keys().chain(ours.keys()).copied().collect();
    names.sort_unstable();
    names.dedup();
    let differing: Vec<String> = names
        .into_iter()
        .filter_map(|name| match (theirs.get(name), ours.get(name)) {
            (Some(_), None) => Some(format!("{name} (only there)")),
            (None, Some(_)) => Some(format!("{name} (only in this export)")),
            (Some(theirs), Some(ours)) if theirs != ours => Some(format!("{name} (another cubin)")),
            _ => None,
        })
        .collect();
    (!differing.is_empty()).then(|| format!("its kernels differ: {}", differing.join(", ")))
}

/// The first 12 digits of a sha256, enough to tell two apart in a message.
fn short(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}
