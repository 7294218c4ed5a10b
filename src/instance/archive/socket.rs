//! The Unix socket between PostgreSQL's `archive_command` and the instance manager.
//!
//! One request per connection: the client writes the WAL file's name and a newline; the
//! manager answers `ok` or `error: <why>` on one line once the file is stored, or is not.
//! The socket is in the manager's own directory, which only the pod's containers see.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

use super::Archiver;

/// The socket's file name in the manager's directory.
pub const SOCKET_NAME: &str = "wal-archive.sock";
/// The longest request line: a WAL file name is at most 40 bytes.
const MAX_REQUEST: u64 = 256;
/// How long the client waits for an answer; PostgreSQL asks again after a failure.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(300);

/// `archive_command` for a manager whose binary is `binary` and socket `socket`, quoted for
/// the shell PostgreSQL runs it with.
pub fn archive_command(binary: &Path, socket: &Path) -> String {
    format!(
        "{} instance archive-wal --socket {} %f",
        shell_quote(&binary.to_string_lossy()),
        shell_quote(&socket.to_string_lossy())
    )
}

pub fn shell_quote(text: &str) -> String {
    let plain = text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// Serves archive requests on `path` until the task is dropped. A stale socket file of an
/// earlier manager is replaced.
pub async fn serve(path: PathBuf, archiver: Arc<Archiver>) -> std::io::Result<()> {
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let listener = UnixListener::bind(&path)?;
    tracing::info!(socket = %path.display(), "WAL archive socket listening");
    loop {
        let (stream, _) = listener.accept().await?;
        let archiver = archiver.clone();
        tokio::spawn(async move {
            if let Err(error) = answer(stream, &archiver).await {
                tracing::warn!(%error, "an archive request could not be answered");
            }
        });
    }
}

async fn answer(stream: tokio::net::UnixStream, archiver: &Arc<Archiver>) -> std::io::Result<()> {
    let (reader, mut writer) = stream.into_split();
    let mut line = String::new();
    tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(reader, MAX_REQUEST))
        .read_line(&mut line)
        .await?;
    let reply = match archiver.archive(line.trim_end()).await {
        Ok(()) => "ok\n".to_owned(),
        Err(error) => format!("error: {}\n", error.replace('\n', " ")),
    };
    writer.write_all(reply.as_bytes()).await?;
    writer.shutdown().await
}

/// The client `archive_command` runs: asks the manager at `socket` to archive `name`.
pub fn request(socket: &Path, name: &str) -> Result<(), String> {
    let mut stream = UnixStream::connect(socket).map_err(|error| {
        format!(
            "cannot reach the instance manager at {}: {error}",
            socket.display()
        )
    })?;
    stream
        .set_read_timeout(Some(ANSWER_TIMEOUT))
        .and_then(|()| stream.write_all(format!("{name}\n").as_bytes()))
        .map_err(|error| format!("cannot send the request: {error}"))?;
    let mut reply = String::new();
    BufReader::new(stream)
        .read_line(&mut reply)
        .map_err(|error| format!("no answer from the instance manager: {error}"))?;
    match reply.trim_end() {
        "ok" => Ok(()),
        "" => Err("the instance manager closed the connection without an answer".to_owned()),
        other => Err(other.strip_prefix("error: ").unwrap_or(other).to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_quotes_only_what_the_shell_would_split() {
        let command = archive_command(
            Path::new("/controller/pgkube"),
            Path::new("/controller/wal-archive.sock"),
        );
        assert_eq!(
            command,
            "/controller/pgkube instance archive-wal --socket /controller/wal-archive.sock %f"
        );
        assert_eq!(shell_quote("/a b/it's"), r"'/a b/it'\''s'");
    }

    #[tokio::test]
    async fn a_request_for_something_else_than_a_wal_file_gets_the_managers_error() {
        let dir = tempfile::tempdir().expect("a directory");
        let socket = dir.path().join(SOCKET_NAME);
        let archiver = Archiver::new(dir.path(), dir.path());
        let server = tokio::spawn(serve(socket.clone(), archiver));
        while !socket.exists() {
            tokio::task::yield_now().await;
        }
        let asked = socket.clone();
        let refused = tokio::task::spawn_blocking(move || request(&asked, "../etc/passwd"))
            .await
            .expect("joined");
        assert_eq!(
            refused,
            Err("\"../etc/passwd\" is not the name of a WAL file".to_owned())
        );
        let asked = socket.clone();
        let unset =
            tokio::task::spawn_blocking(move || request(&asked, "000000010000000000000001"))
                .await
                .expect("joined")
                .expect_err("no settings");
        assert!(unset.contains("no archive settings"), "{unset}");
        server.abort();
    }
}
