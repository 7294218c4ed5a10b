//! This machine's processes, found through `/proc`: the test bed's real node runs pods as local
//! processes, so a test can check that a stopped instance left none behind.

/// The processes that have `variable` (`NAME=value`) in their environment (a pod's processes
/// inherit `POD_NAME=<pod>` from their container).
pub fn processes_with_env(variable: &str) -> Vec<u32> {
    processes_where("environ", |environ| {
        environ
            .split(|byte| *byte == 0)
            .any(|entry| entry == variable.as_bytes())
    })
}

/// The processes whose command line has every one of `words` among its arguments' text.
pub fn processes_with_args(words: &[&str]) -> Vec<u32> {
    processes_where("cmdline", |cmdline| {
        let text = String::from_utf8_lossy(cmdline).replace('\0', " ");
        words.iter().all(|word| text.contains(word))
    })
}

/// The processes whose `/proc/<pid>/<file>` satisfies `matches`. Processes that end while
/// being read, or that this user may not read, are left out.
fn processes_where(file: &str, matches: impl Fn(&[u8]) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/{file}")).is_ok_and(|content| matches(&content))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_process_is_found_by_its_environment_and_arguments() {
        let me = std::process::id();
        let path = std::env::var("PATH").expect("PATH is set");
        assert!(processes_with_env(&format!("PATH={path}")).contains(&me));
        let program = std::env::args().next().expect("argv[0]");
        assert!(processes_with_args(&[&program]).contains(&me));
        assert!(!processes_with_env("PGKUBE_NO_SUCH_VARIABLE=1").contains(&me));
    }
}
