//! Admission against the real API server of the test bed: every sample in `deploy/samples/` is
//! accepted by `kubectl apply`, and every manifest in `tests/admission/invalid/` is rejected with
//! an error that names the offending field.
//!
//! Corpus format: each invalid file has a `# expect: <text>` line; the API server's error must
//! contain that text (a field path such as `spec.replicas`). A file with two YAML documents is a
//! forbidden update: the first document must be accepted, then the second must be refused.

use std::path::{Path, PathBuf};
use std::process::Output;

use pgkube_testkit::{TestEnv, TestNamespace, install_crds, testbed};

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn apply(env: &TestEnv, namespace: &str, manifest: &str) -> Output {
    env.kubectl_with_input(&["apply", "--namespace", namespace, "-f", "-"], manifest)
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML files in {}", dir.display());
    files
}

#[tokio::test]
async fn every_sample_is_accepted() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "samples").await;
    for sample in yaml_files(&repo_path("deploy/samples")) {
        let manifest = std::fs::read_to_string(&sample).expect("sample readable");
        let output = apply(&env, namespace.name(), &manifest);
        assert!(
            output.status.success(),
            "{} was rejected: {}",
            sample.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    namespace.cleanup().await;
}

/// One invalid manifest: documents to apply in order, of which only the last must fail.
struct InvalidCase {
    file: PathBuf,
    expected: String,
    documents: Vec<String>,
}

fn load_invalid_case(file: PathBuf, unique_name: &str) -> InvalidCase {
    let text = std::fs::read_to_string(&file).expect("corpus file readable");
    let expected = text
        .lines()
        .find_map(|line| line.strip_prefix("# expect:"))
        .unwrap_or_else(|| panic!("{} has no `# expect:` line", file.display()))
        .trim()
        .to_owned();
    // Each case gets its own object name so that cases never see each other's objects.
    let documents = text
        .split("\n---\n")
        .map(|doc| doc.replace("name: bad\n", &format!("name: {unique_name}\n")))
        .collect();
    InvalidCase {
        file,
        expected,
        documents,
    }
}

#[tokio::test]
async fn every_invalid_manifest_is_rejected_naming_the_field() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "invalid").await;
    let files = yaml_files(&repo_path("tests/admission/invalid"));
    for (index, file) in files.into_iter().enumerate() {
        let case = load_invalid_case(file, &format!("bad-{index}"));
        let (last, setup) = case.documents.split_last().expect("at least one document");
        for document in setup {
            let output = apply(&env, namespace.name(), document);
            assert!(
                output.status.success(),
                "{}: the first document must be accepted: {}",
                case.file.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let output = apply(&env, namespace.name(), last);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "{} was accepted but must be rejected",
            case.file.display()
        );
        assert!(
            stderr.contains(&case.expected),
            "{}: the error does not name `{}`: {stderr}",
            case.file.display(),
            case.expected
        );
    }
    namespace.cleanup().await;
}
