//! Documentation that is generated must be current: deploy/CONFIGURATION.md is the `--help`
//! of every binary, as `tools/config-reference.sh` writes it.

use std::path::Path;

use jetsched_tests::workspace_bin;

#[test]
fn configuration_reference_matches_every_binarys_help() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root");
    let bin_dir = workspace_bin("jetsched").parent().expect("binary dir").to_path_buf();
    let out = tempfile::NamedTempFile::new().expect("temp file");
    let status = std::process::Command::new("bash")
        .arg(repo.join("tools/config-reference.sh"))
        .arg(&bin_dir)
        .arg(out.path())
        .status()
        .expect("run tools/config-reference.sh");
    assert!(status.success(), "tools/config-reference.sh failed");
    let generated = std::fs::read_to_string(out.path()).expect("generated reference");
    let committed = std::fs::read_to_string(repo.join("deploy/CONFIGURATION.md")).unwrap_or_default();
    assert!(
        generated == committed,
        "deploy/CONFIGURATION.md is out of date: run `bash tools/config-reference.sh` and commit it"
    );
}
