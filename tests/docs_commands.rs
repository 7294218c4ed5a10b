//! Every shell block in the README and in `docs/` says whether something runs it: its first line
//! is `# run by <file>[, <file>...] ...` naming the test, script or CI step that runs those
//! commands (each file must exist and mention the program each command starts with), or
//! `# not run ...` with the reason. A command a reader copies is then either exercised or
//! visibly not.
//!
//! Commands quoted inline in prose are not checked; `docs/api.md` is generated and has none.

use std::path::{Path, PathBuf};

/// Languages of the fenced blocks that hold commands.
const SHELL_BLOCKS: &[&str] = &["sh", "bash", "shell", "console"];

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The README and every page in `docs/`.
fn documents() -> Vec<PathBuf> {
    let root = repository();
    let mut documents = vec![root.join("README.md")];
    let mut pages: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    documents.extend(pages);
    documents
}

/// A shell block: where it starts, and its lines.
struct Block {
    line: usize,
    lines: Vec<String>,
}

fn shell_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(bool, Block)> = None;
    for (number, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (fence, open.take()) {
            (Some(_), Some((shell, block))) => {
                if shell {
                    blocks.push(block);
                }
            }
            (Some(language), None) => {
                let shell = SHELL_BLOCKS.contains(&language.trim());
                open = Some((
                    shell,
                    Block {
                        line: number + 1,
                        lines: Vec::new(),
                    },
                ));
            }
            (None, Some((shell, mut block))) => {
                block.lines.push(line.trim().to_owned());
                open = Some((shell, block));
            }
            (None, None) => {}
        }
    }
    blocks
}

/// The program each command of the block starts with (`helm`, `kubectl`, `deploy/local-up`).
fn programs(block: &Block) -> Vec<String> {
    let mut programs = Vec::new();
    let mut continued = false;
    for line in &block.lines {
        let starts_command = !continued && !line.is_empty() && !line.starts_with('#');
        continued = line.ends_with('\\');
        if !starts_command {
            continue;
        }
        let command = line.trim_start_matches("$ ");
        let program = command
            .split_whitespace()
            .find(|word| !word.contains('=') || word.starts_with('-'))
            .unwrap_or_default();
        programs.push(program.trim_start_matches("./").to_owned());
    }
    programs
}

/// The files a `# run by` line names: the words that are paths of this repository.
fn runners(mark: &str, root: &Path) -> Vec<PathBuf> {
    mark.split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')' || c == ';')
        .map(|word| word.trim_end_matches(['.', ':']))
        .filter(|word| word.contains('/') || word.ends_with(".rs"))
        .map(|word| root.join(word))
        .filter(|path| path.is_file())
        .collect()
}

/// What is wrong with `block`, if anything.
fn problem(block: &Block, root: &Path) -> Option<String> {
    let first = block.lines.iter().find(|line| !line.is_empty())?;
    if first.starts_with("# not run") {
        return None;
    }
    let Some(mark) = first.strip_prefix("# run by ") else {
        return Some(format!(
            "starts with neither `# run by <file>` nor `# not run`: {first:?}"
        ));
    };
    let files = runners(mark, root);
    if files.is_empty() {
        return Some(format!(
            "`# run by` names no file of the repository: {first:?}"
        ));
    }
    let contents: Vec<String> = files
        .iter()
        .map(|file| std::fs::read_to_string(file).unwrap_or_default())
        .collect();
    programs(block)
        .into_iter()
        .find(|program| !contents.iter().any(|text| text.contains(program.as_str())))
        .map(|program| format!("`{program}` is in none of the files it names ({mark})"))
}

#[test]
fn every_shell_block_says_what_runs_it() {
    let root = repository();
    let mut problems = Vec::new();
    for document in documents() {
        let text = std::fs::read_to_string(&document).expect("a document");
        let name = document
            .strip_prefix(&root)
            .unwrap_or(&document)
            .display()
            .to_string();
        for block in shell_blocks(&text) {
            if let Some(problem) = problem(&block, &root) {
                problems.push(format!("{name}:{}: {problem}", block.line));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_block_without_a_mark_or_naming_the_wrong_runner_is_found() {
    let root = repository();
    let text = "```sh\nkubectl get pods\n```\n\n```sh\n# run by .ci/run\nhelm lint x\n```\n\n\
                ```sh\n# run by .ci/run\ndeploy/local-up\ntests/run\n```\n\n```yaml\na: b\n```\n\n\
                ```sh\n# not run: no cluster here\nkubectl delete x \\\n  --wait\n```\n";
    let blocks = shell_blocks(text);
    assert_eq!(blocks.len(), 4, "the yaml block is not a shell block");
    let found: Vec<_> = blocks.iter().map(|block| problem(block, &root)).collect();
    assert!(
        found[0].as_deref().is_some_and(|p| p.contains("neither")),
        "{found:?}"
    );
    assert!(
        found[1].as_deref().is_some_and(|p| p.contains("`helm`")),
        "{found:?}"
    );
    assert_eq!(found[2], None, ".ci/run runs both");
    assert_eq!(found[3], None);
    assert_eq!(
        programs(&blocks[3]),
        vec!["kubectl"],
        "a continued line is one command"
    );
}
