//! Packages without NVRTC: writing, reading, determinism, tamper detection, replacement, and
//! the committed manifest schema.

use std::fs;
use std::path::Path;

use prepare::hash::sha256_hex;
use prepare::ladder::Arch;
use prepare::package::{
    self, open_package, write_package, FileProblemKind, Manifest, PackageError,
};

use crate::support::fixtures::{
    compilation, files, ladder, mixed_qualification, names, reseal, scratch, try_write_fixture,
    write_fixture, LADDER,
};
use crate::support::repository::root;

#[test]
fn round_trip_gives_back_what_was_written() {
    let (_scratch, out) = scratch();
    let ladder = ladder(LADDER);
    let compiled = compilation(&ladder, Arch::Sm120);
    let summary = write_package(&out, LADDER, &ladder, &compiled, Arch::Sm120, false).unwrap();

    let package = open_package(&out).unwrap();
    let manifest_bytes = fs::read(out.join("manifest.json")).unwrap();
    assert_eq!(package.identity(), sha256_hex(&manifest_bytes));
    assert_eq!(summary.identity, package.identity());
    // The three custom kernels, and the rank-order sum every package beyond two ranks holds.
    assert_eq!((summary.kernels, summary.buckets), (4, 2));
    assert!(!summary.replaced);
    assert_eq!(package.ladder(), &ladder);
    assert_eq!(package.arch(), Arch::Sm120);
    assert_eq!(
        package.manifest(),
        &package::build_manifest(LADDER, &ladder, &compiled, Arch::Sm120, None).unwrap()
    );
    assert_eq!(
        fs::read(out.join("ladder.json")).unwrap(),
        LADDER.as_bytes()
    );
    let cubins: Vec<(&str, &[u8])> = package
        .kernels()
        .map(|(record, cubin)| (record.name.as_str(), cubin))
        .collect();
    let expected: Vec<(&str, &[u8])> = compiled
        .kernels
        .iter()
        .map(|kernel| (kernel.name.as_str(), kernel.cubin.as_slice()))
        .collect();
    assert_eq!(cubins, expected);
    for kernel in &compiled.kernels {
        assert_eq!(package.cubin(&kernel.name), Some(kernel.cubin.as_slice()));
    }
    assert_eq!(package.cubin("no_such_kernel"), None);
}

#[test]
fn manifest_describes_buckets_candidates_and_kernels() {
    let (_scratch, out) = scratch();
    write_fixture(&out, Arch::Sm121);
    let manifest = fs::read_to_string(out.join("manifest.json")).unwrap();
    // The tool version moves with releases and the checksum with it.
    insta::with_settings!({filters => vec![
        (r#""tool_version": "[^"]*""#, r#""tool_version": "[tool version]""#),
        (r#""checksum": "[0-9a-f]{64}""#, r#""checksum": "[checksum]""#),
    ]}, {
        insta::assert_snapshot!(manifest);
    });
}

#[test]
fn writing_twice_gives_identical_bytes() {
    let (_scratch, first) = scratch();
    let second = first.with_file_name("again");
    write_fixture(&first, Arch::Sm120);
    write_fixture(&second, Arch::Sm120);
    assert_eq!(files(&first), files(&second));
    assert_eq!(
        files(&first).keys().collect::<Vec<_>>(),
        [
            "kernels/all_reduce_one_shot_pull_bf16.sm_120.cubin",
            "kernels/all_reduce_one_shot_push_bf16.sm_120.cubin",
            "kernels/all_reduce_rsag_phased_bf16.sm_120.cubin",
            "kernels/nccl_rank_order_sum_bf16.sm_120.cubin",
            "ladder.json",
            "manifest.json",
        ]
    );
    let manifest = String::from_utf8(fs::read(first.join("manifest.json")).unwrap()).unwrap();
    assert!(
        manifest.ends_with("}\n"),
        "the manifest ends with one newline"
    );
}

#[test]
fn a_package_without_kernels_round_trips() {
    let (_scratch, out) = scratch();
    // Its only candidate is NCCL: it compiles no kernel.
    let text =
        fs::read_to_string(root().join("tests/fixtures/ladders/valid/minimal.json")).unwrap();
    let ladder = ladder(&text);
    let compiled = compilation(&ladder, Arch::Sm90);
    assert!(compiled.kernels.is_empty());
    write_package(&out, &text, &ladder, &compiled, Arch::Sm90, false).unwrap();
    let package = open_package(&out).unwrap();
    assert_eq!(package.arch(), Arch::Sm90);
    assert_eq!(package.kernels().count(), 0);
    assert_eq!(names(&out), ["kernels", "ladder.json", "manifest.json"]);
}

/// Every byte of the manifest and the ladder, and bytes spread over each cubin: flipping any
/// one makes the package refused, naming the file.
#[test]
fn flipping_any_byte_of_any_file_is_refused_by_name() {
    let (_scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    for (relative, original) in files(&out) {
        let path = out.join(&relative);
        let positions: Vec<usize> = if Path::new(&relative)
            .extension()
            .is_some_and(|extension| extension == "cubin")
        {
            (0..original.len())
                .step_by(37)
                .chain([original.len() - 1])
                .collect()
        } else {
            (0..original.len()).collect()
        };
        for position in positions {
            let mut bytes = original.clone();
            bytes[position] ^= 0x01;
            fs::write(&path, &bytes).unwrap();
            let error = open_package(&out).expect_err(&format!(
                "flipping byte {position} of {relative} must be refused"
            ));
            let message = error.to_string();
            assert!(
                message.contains(&relative),
                "flipping byte {position} of {relative}: the error does not name it: {message}"
            );
            if relative != "manifest.json" {
                let PackageError::Files { problems, .. } = &error else {
                    panic!("flipping byte {position} of {relative}: {message}");
                };
                assert_eq!(problems.len(), 1, "{message}");
                assert_eq!(problems[0].path, relative);
                assert!(matches!(problems[0].kind, FileProblemKind::Changed { .. }));
            }
        }
        fs::write(&path, &original).unwrap();
    }
    open_package(&out).expect("restored package opens");
}

#[test]
fn changed_files_are_listed_together() {
    let (_scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    fs::write(out.join("ladder.json"), "{}\n").unwrap();
    fs::remove_file(out.join("kernels/all_reduce_rsag_phased_bf16.sm_120.cubin")).unwrap();
    fs::write(out.join("notes.txt"), "hello").unwrap();
    fs::write(out.join("kernels/stray.sm_120.cubin"), "stray").unwrap();
    fs::create_dir(out.join("extra")).unwrap();
    let error = open_package(&out).unwrap_err();
    let message = error
        .to_string()
        .replace(out.to_str().unwrap(), "[package]");
    insta::assert_snapshot!(message);
}

#[test]
fn missing_files_are_refused_by_name() {
    let (_scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    for relative in files(&out).keys() {
        let (_copy_scratch, copy) = scratch();
        write_fixture(&copy, Arch::Sm120);
        fs::remove_file(copy.join(relative)).unwrap();
        let error = open_package(&copy).unwrap_err();
        if relative == "manifest.json" {
            assert!(matches!(error, PackageError::NoManifest { .. }), "{error}");
            continue;
        }
        let PackageError::Files { problems, .. } = &error else {
            panic!("removing {relative}: {error}");
        };
        assert_eq!(problems.len(), 1, "{error}");
        assert_eq!(problems[0].path, *relative);
        assert_eq!(problems[0].kind, FileProblemKind::Missing);
        assert!(error.to_string().contains(&format!("{relative}: missing")));
    }
}

#[test]
fn extra_entries_are_refused_by_name() {
    type Make = fn(&Path);
    let extras: [(&str, Make); 4] = [
        ("README", |path| fs::write(path, "x").unwrap()),
        ("kernels/other.sm_120.cubin", |path| {
            fs::write(path, "x").unwrap();
        }),
        ("cache/", |path| fs::create_dir(path).unwrap()),
        ("kernels/nested/", |path| fs::create_dir(path).unwrap()),
    ];
    for (relative, make) in extras {
        let (_scratch, out) = scratch();
        write_fixture(&out, Arch::Sm120);
        make(&out.join(relative));
        let error = open_package(&out).unwrap_err();
        let PackageError::Files { problems, .. } = &error else {
            panic!("adding {relative}: {error}");
        };
        assert_eq!(problems.len(), 1, "{error}");
        assert_eq!(
            (problems[0].path.as_str(), &problems[0].kind),
            (relative, &FileProblemKind::Extra)
        );
    }
}

#[cfg(unix)]
#[test]
fn a_link_in_place_of_a_file_is_refused() {
    let (scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let cubin = out.join("kernels/all_reduce_one_shot_push_bf16.sm_120.cubin");
    let elsewhere = scratch.path().join("elsewhere.cubin");
    fs::rename(&cubin, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &cubin).unwrap();
    let error = open_package(&out).unwrap_err();
    let PackageError::Files { problems, .. } = &error else {
        panic!("{error}");
    };
    assert_eq!(problems[0].kind, FileProblemKind::NotAFile, "{error}");
}

#[test]
fn unknown_format_versions_are_refused_naming_the_writer() {
    let (_scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let original = fs::read_to_string(out.join("manifest.json")).unwrap();
    let mut messages = Vec::new();
    for (version, writer) in [(2, Some("0.3.0")), (7, None), (0, None)] {
        let mut value: serde_json::Value = serde_json::from_str(&original).unwrap();
        value["format_version"] = version.into();
        match writer {
            Some(writer) => value["tool_version"] = writer.into(),
            None => drop(value.as_object_mut().unwrap().remove("tool_version")),
        }
        fs::write(out.join("manifest.json"), value.to_string()).unwrap();
        let error = open_package(&out).unwrap_err();
        assert!(
            matches!(&error, PackageError::UnknownFormat { found, .. } if *found == version),
            "{error}"
        );
        messages.push(
            error
                .to_string()
                .replace(out.to_str().unwrap(), "[package]"),
        );
    }
    let version = prepare::TOOL_VERSION;
    insta::with_settings!({filters => vec![(version, "[tool version]")]}, {
        insta::assert_snapshot!(messages.join("\n"));
    });
}

#[test]
fn a_manifest_that_is_not_json_or_breaks_the_schema_is_refused_with_its_path() {
    let (_scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let path = out.join("manifest.json");
    let original = fs::read_to_string(&path).unwrap();

    fs::write(&path, "{\n  \"format_version\": 1,\n  oops\n}\n").unwrap();
    let error = open_package(&out).unwrap_err();
    assert!(
        matches!(
            &error,
            PackageError::ManifestSyntax {
                line: 3,
                column: 3,
                ..
            }
        ),
        "{error}"
    );
    assert!(error
        .to_string()
        .starts_with(&format!("{}:3:3: not valid JSON", path.display())));

    let mut value: serde_json::Value = serde_json::from_str(&original).unwrap();
    value["kernels"][0]["registers"] = "many".into();
    value["kernels"][1]["file"] = "../../etc/passwd".into();
    value
        .as_object_mut()
        .unwrap()
        .insert("signed_by".into(), "me".into());
    fs::write(&path, value.to_string()).unwrap();
    let error = open_package(&out).unwrap_err();
    let PackageError::ManifestSchema {
        path: found,
        problems,
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!(found, &path);
    let mut pointers: Vec<&str> = problems
        .iter()
        .map(|problem| problem.pointer.as_str())
        .collect();
    pointers.sort_unstable();
    assert_eq!(
        pointers,
        ["", "/kernels/0/registers", "/kernels/1/file"],
        "{error}"
    );
}

#[test]
fn a_manifest_that_disagrees_with_itself_or_the_ladder_is_refused() {
    type Change = fn(&mut Manifest);
    let cases: [(&str, Change); 5] = [
        ("/buckets/0/default", |manifest| {
            manifest.buckets[0].default = "rsag_phased".into();
        }),
        ("/kernels/0/file", |manifest| {
            manifest.kernels[0].file = "kernels/all_reduce_one_shot_pull_bf16.sm_121.cubin".into();
        }),
        ("/buckets/1/candidates/0/cluster_scheduling", |manifest| {
            manifest.buckets[1].candidates[0].cluster_scheduling = false;
        }),
        ("/ladder/name", |manifest| {
            manifest.ladder.name = "another".into();
        }),
        ("/buckets/1/max_bytes", |manifest| {
            manifest.buckets[1].max_bytes = 131_072;
        }),
    ];
    for (pointer, change) in cases {
        let (_scratch, out) = scratch();
        write_fixture(&out, Arch::Sm120);
        reseal(&out, change);
        let error = open_package(&out).unwrap_err();
        let PackageError::ManifestInconsistent { problems, .. } = &error else {
            panic!("{pointer}: {error}");
        };
        assert_eq!(problems[0].pointer, pointer, "{error}");
    }
}

#[test]
fn qualification_round_trips() {
    let (_scratch, out) = scratch();
    try_write_fixture(&out, Arch::Sm120, Some(mixed_qualification()), false).unwrap();
    let package = open_package(&out).unwrap();
    assert_eq!(
        package.manifest().qualification,
        Some(mixed_qualification())
    );
}

#[test]
fn a_qualification_that_does_not_fit_the_buckets_is_not_written() {
    let (scratch, out) = scratch();
    let mut wrong = mixed_qualification();
    wrong.buckets[1].candidates.swap(0, 1);
    let error = try_write_fixture(&out, Arch::Sm120, Some(wrong), false).unwrap_err();
    let PackageError::ManifestInconsistent { problems, .. } = &error else {
        panic!("{error}");
    };
    assert_eq!(problems[0].pointer, "/qualification/buckets/1/candidates");
    assert!(names(scratch.path()).is_empty(), "nothing is left behind");
}

#[test]
fn an_existing_output_is_refused_without_force_and_left_as_it_was() {
    let (scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let before = files(&out);
    let error = try_write_fixture(&out, Arch::Sm121, None, false).unwrap_err();
    assert!(matches!(error, PackageError::Exists { .. }), "{error}");
    assert_eq!(files(&out), before);
    assert_eq!(names(scratch.path()), ["pkg"]);
}

#[test]
fn force_replaces_a_package_and_leaves_nothing_else() {
    let (scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let summary = try_write_fixture(&out, Arch::Sm121, None, true).unwrap();
    assert!(summary.replaced);
    assert_eq!(open_package(&out).unwrap().arch(), Arch::Sm121);
    assert!(files(&out).keys().all(|path| !path.contains("sm_120")));
    assert_eq!(names(scratch.path()), ["pkg"]);
}

#[test]
fn force_fills_an_empty_directory() {
    let (_scratch, out) = scratch();
    fs::create_dir(&out).unwrap();
    let ladder = ladder(LADDER);
    let compiled = compilation(&ladder, Arch::Sm120);
    let error = write_package(&out, LADDER, &ladder, &compiled, Arch::Sm120, false).unwrap_err();
    assert!(matches!(error, PackageError::Exists { .. }), "{error}");
    write_package(&out, LADDER, &ladder, &compiled, Arch::Sm120, true).unwrap();
    open_package(&out).unwrap();
}

#[test]
fn force_never_replaces_what_is_not_a_package() {
    let (scratch, out) = scratch();
    let ladder = ladder(LADDER);
    let compiled = compilation(&ladder, Arch::Sm120);

    fs::create_dir(&out).unwrap();
    fs::write(out.join("thesis.tex"), "precious").unwrap();
    let error = write_package(&out, LADDER, &ladder, &compiled, Arch::Sm120, true).unwrap_err();
    assert!(matches!(error, PackageError::NotAPackage { .. }), "{error}");
    assert_eq!(names(&out), ["thesis.tex"]);

    let file = scratch.path().join("file");
    fs::write(&file, "precious").unwrap();
    let error = write_package(&file, LADDER, &ladder, &compiled, Arch::Sm120, true).unwrap_err();
    assert!(matches!(error, PackageError::NotAPackage { .. }), "{error}");
    assert_eq!(fs::read(&file).unwrap(), b"precious");
    assert_eq!(names(scratch.path()), ["file", "pkg"]);
}

#[test]
fn a_refused_export_leaves_nothing_behind() {
    let (scratch, out) = scratch();
    let ladder = ladder(LADDER);

    // The ladder does not target sm_90.
    let error = try_write_fixture(&out, Arch::Sm90, None, false).unwrap_err();
    assert!(matches!(error, PackageError::NotTargeted { .. }), "{error}");

    // A compilation that lacks a kernel a candidate needs.
    let mut partial = compilation(&ladder, Arch::Sm120);
    partial.kernels.retain(|kernel| !kernel.cluster);
    let error = write_package(&out, LADDER, &ladder, &partial, Arch::Sm120, false).unwrap_err();
    assert!(
        matches!(&error, PackageError::MissingKernel { profile, .. } if profile == "rsag_phased"),
        "{error}"
    );

    // Kernels compiled for another architecture.
    let error = write_package(
        &out,
        LADDER,
        &ladder,
        &compilation(&ladder, Arch::Sm121),
        Arch::Sm120,
        false,
    )
    .unwrap_err();
    assert!(matches!(error, PackageError::BadKernel { .. }), "{error}");

    // A kernel whose name is no file name.
    let mut odd = compilation(&ladder, Arch::Sm120);
    odd.kernels.push(prepare::compile::CompiledKernel {
        name: "../escape".into(),
        ..odd.kernels[0].clone()
    });
    let error = write_package(&out, LADDER, &ladder, &odd, Arch::Sm120, false).unwrap_err();
    assert!(
        matches!(&error, PackageError::ManifestSchema { problems, .. } if problems[0].pointer == "/kernels/0/name"),
        "{error}"
    );

    // Ladder text that is not the ladder.
    let error = write_package(&out, "{}", &ladder, &partial, Arch::Sm120, false).unwrap_err();
    assert!(matches!(error, PackageError::LadderTextMismatch), "{error}");

    assert!(names(scratch.path()).is_empty(), "nothing is left behind");
}

#[test]
fn a_ladder_that_matches_its_hash_but_is_invalid_is_refused() {
    let (_scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let invalid = LADDER.replace("\"world_size\": 4", "\"world_size\": 9");
    fs::write(out.join("ladder.json"), &invalid).unwrap();
    reseal(&out, |manifest| {
        manifest.ladder.sha256 = sha256_hex(invalid.as_bytes());
    });
    let error = open_package(&out).unwrap_err();
    assert!(
        matches!(error, PackageError::InvalidLadder { .. }),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("ladder.json is not a valid ladder:"),
        "{message}"
    );
    assert!(message.contains("/world_size"), "{message}");
}

#[test]
fn missing_parent_directories_are_made() {
    let ladder = ladder(LADDER);
    let compiled = compilation(&ladder, Arch::Sm120);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("not").join("yet").join("package");
    write_package(&out, LADDER, &ladder, &compiled, Arch::Sm120, false).unwrap();
    open_package(&out).unwrap();
}

#[test]
fn a_failed_write_removes_the_empty_directories_it_made_and_nothing_above() {
    let ladder = ladder(LADDER);
    let compiled = compilation(&ladder, Arch::Sm120);
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("there")).unwrap();
    // A name the staging directory's longer name cannot have: the write fails after making the
    // directories.
    let out = dir.path().join("there/not/yet").join("n".repeat(250));
    let error = write_package(&out, LADDER, &ladder, &compiled, Arch::Sm120, false).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("cannot create a staging directory in "),
        "{error}"
    );
    assert_eq!(names(dir.path()), ["there"]);
    assert!(names(&dir.path().join("there")).is_empty());
}

#[test]
fn a_file_name_that_is_not_utf8_is_named_escaped() {
    use std::os::unix::ffi::OsStrExt as _;
    let (_scratch, out) = scratch();
    write_fixture(&out, Arch::Sm120);
    let name = std::ffi::OsStr::from_bytes(b"bad\xff\x1b");
    fs::write(out.join("kernels").join(name), b"").unwrap();
    let error = open_package(&out).unwrap_err().to_string();
    assert!(
        error.ends_with(
            "does not match its manifest:\n  kernels/bad\\xff\\x1b: its name is not UTF-8"
        ),
        "{error}"
    );
}
