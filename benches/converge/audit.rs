//! The API server's own record of the manager's requests: the test bed's audit log holds the
//! metadata of every request by a ServiceAccount of `pgkube-system` (tests/testbed/up), and the
//! bench's manager runs as one of its own, so its requests are told apart from everyone else's.
//! (The API server's `apiserver_request_total` has no user label, so it cannot.)

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One request: its verb, and the resource (with `/subresource`) it was made on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    pub verb: String,
    pub resource: String,
}

/// Reads the requests of one user appended to the audit log after a point.
pub struct AuditLog {
    path: PathBuf,
    username: String,
}

/// A position in the audit log: the file (its inode, which it keeps when the API server
/// rotates it away at 100 MB under a dated name) and an offset in it.
#[derive(Clone, Copy)]
pub struct Mark {
    inode: u64,
    offset: u64,
}

impl AuditLog {
    pub fn new(path: &Path, username: &str) -> AuditLog {
        AuditLog {
            path: path.to_owned(),
            username: username.to_owned(),
        }
    }

    /// The log's end now.
    pub fn mark(&self) -> Mark {
        let meta = std::fs::metadata(&self.path).ok();
        Mark {
            inode: meta.as_ref().map_or(0, |meta| meta.ino()),
            offset: meta.map_or(0, |meta| meta.len()),
        }
    }

    /// The user's requests between `from` and `to`, each once: a watch by the event of its
    /// start (it has another when it ends), any other request by its only event (the policy
    /// omits the RequestReceived stage).
    pub fn requests(&self, from: Mark, to: Mark) -> Vec<Request> {
        let text = self.read(from, to);
        let mut requests = Vec::new();
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let starts = match event["stage"].as_str() {
                Some("ResponseStarted") => true,
                Some("ResponseComplete") => event["verb"] != "watch",
                _ => false,
            };
            if starts && event["user"]["username"] == self.username.as_str() {
                requests.push(request(&event));
            }
        }
        requests
    }

    /// The text from `from` to `to`: when the log was rotated in between, the rest of the
    /// rotated file (found by its inode) and then the current one from its start.
    fn read(&self, from: Mark, to: Mark) -> String {
        if from.inode == to.inode {
            return read_range(&self.path, from.offset, to.offset);
        }
        let rotated = self.file_with_inode(from.inode);
        let mut text =
            rotated.map_or_else(String::new, |path| read_range(&path, from.offset, u64::MAX));
        text.push_str(&read_range(&self.path, 0, to.offset));
        text
    }

    fn file_with_inode(&self, inode: u64) -> Option<PathBuf> {
        let dir = self.path.parent()?;
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .find(|entry| entry.metadata().is_ok_and(|meta| meta.ino() == inode))
            .map(|entry| entry.path())
    }
}

fn read_range(path: &Path, from: u64, to: u64) -> String {
    let mut file = std::fs::File::open(path)
        .unwrap_or_else(|e| panic!("reading the audit log {}: {e}", path.display()));
    file.seek(SeekFrom::Start(from))
        .expect("seek in the audit log");
    let mut bytes = Vec::new();
    file.take(to.saturating_sub(from))
        .read_to_end(&mut bytes)
        .expect("reading the audit log");
    String::from_utf8_lossy(&bytes).into_owned()
}

fn request(event: &serde_json::Value) -> Request {
    let object = &event["objectRef"];
    let mut resource = object["resource"].as_str().unwrap_or("-").to_owned();
    if let Some(subresource) = object["subresource"].as_str() {
        resource = format!("{resource}/{subresource}");
    }
    Request {
        verb: event["verb"].as_str().unwrap_or_default().to_owned(),
        resource,
    }
}
