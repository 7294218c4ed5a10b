//! The image's promise: `pgkube` is one statically linked (musl) binary, so that the same file
//! runs in any PostgreSQL image, whatever its C library. The test builds the binary for
//! `x86_64-unknown-linux-musl` (or takes the file `PGKUBE_STATIC_BINARY` names), checks that it
//! asks for no program interpreter and no shared library, and runs it as a pod does:
//!
//! - the init container, in an image holding only the binary (no shell, no C library: the
//!   distroless image's case), copies it into the volume it shares with PostgreSQL's container
//!   (`pgkube instance install`);
//! - PostgreSQL's container, in a root filesystem holding only PostgreSQL, runs it from that
//!   volume as PID 1 (`pgkube instance run`), which initialises and starts PostgreSQL.
//!
//! Each runs in new mount and PID namespaces with `unshare --root`, as the pod's user: the
//! PostgreSQL images' `postgres` (999), which the pod's security context sets for both. The
//! PostgreSQL root filesystem is made of this machine's Debian PostgreSQL: its programs, the
//! libraries they load, its data files and time zones, the C.UTF-8 locale, and the shell that
//! initdb and PostgreSQL run commands with. Its programs find glibc's loader at a path of their
//! own, not at `/lib64/ld-linux-x86-64.so.2`, as in an image built on another C library
//! (Alpine's): a dynamically linked pgkube does not start there, nor in the image.
//!
//! A static binary resolves names itself (musl's resolver: `/etc/hosts`, then the DNS servers,
//! search domains and `ndots` of `/etc/resolv.conf`), with no NSS module of the image's C
//! library. A replica there finds its primary by its headless Service name, `<pod>.<service>.
//! <namespace>.svc`, as in a pod: through a DNS server (the test's) that knows only the
//! `cluster.local` names, so that the name resolves only through the search domains.
//!
//! Root only. The binary builds with the dev profile into `<target dir>/musl`, or
//! `PGKUBE_MUSL_TARGET_DIR` (a directory of its own, so that the build holds no lock of the
//! running `cargo test`), with Debian's `musl-tools` compiler for the C dependencies.

mod instance_common;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use instance_common::{
    Bed, Chroot, MAJOR, MAX_INSTANCES, STATEFULSET, address_of, nix_is_root, wait_status,
};
use pgkube_testkit::unique_name;

const TARGET: &str = "x86_64-unknown-linux-musl";
/// The PostgreSQL images' `postgres` user and group.
const POSTGRES_ID: u32 = 999;
/// Where the PostgreSQL programs of the root filesystem find glibc's loader.
const LOADER: &str = "/usr/lib/postgresql/ld.so";
/// The programs `pgkube instance` runs.
const PROGRAMS: [&str; 5] = [
    "postgres",
    "initdb",
    "pg_controldata",
    "pg_basebackup",
    "pg_rewind",
];

#[tokio::test]
async fn the_static_binary_installs_from_an_image_of_its_own_and_runs_postgresql_in_its_image() {
    assert!(nix_is_root(), "runs as root only: namespaces, chroot");
    let binary = static_binary();
    let elf = std::fs::read(binary).expect("the binary reads");
    assert_eq!(
        interpreter(&elf),
        None,
        "{} asks for a program interpreter",
        binary.display()
    );
    assert_eq!(
        needed_libraries(&elf),
        0,
        "{} asks for shared libraries",
        binary.display()
    );

    let root = PostgresRoot::build();
    root.install_from_image(binary);
    let mut bed = Bed::in_root(root.chroot());
    let primary = bed.start(0, 1);
    wait_status(&bed, primary, "a ready primary", |s| {
        s["role"] == "primary" && s["ready"] == true
    })
    .await;
    let client = bed.sql(primary, "first").await.expect("PostgreSQL answers");
    let row = client
        .query_one(
            "SELECT current_setting('data_directory'), current_setting('server_version_num')",
            &[],
        )
        .await
        .expect("a query runs");
    let data_directory: String = row.get(0);
    let version: String = row.get(1);
    // The path is the one in the root filesystem: the server runs there.
    assert_eq!(
        Path::new(&data_directory),
        bed.instances[primary].seen_dir.join("data/pgdata")
    );
    assert!(version.starts_with(MAJOR), "{version}");
}

#[tokio::test]
async fn a_replica_finds_its_primary_by_service_name_through_the_search_domains() {
    assert!(
        nix_is_root(),
        "runs as root only: namespaces, chroot, port 53"
    );
    let root = PostgresRoot::build();
    root.install_from_image(static_binary());
    let dns = Dns::start(&root.dir).await;
    let mut bed = Bed::in_root(root.chroot());
    bed.domain = Some(format!("{STATEFULSET}.{NAMESPACE}.svc"));
    let primary = bed.start(0, 2);
    wait_status(&bed, primary, "a ready primary", |s| {
        s["role"] == "primary" && s["ready"] == true
    })
    .await;
    let replica = bed.start(1, 2);
    wait_status(&bed, replica, "a streaming replica of it-0", |s| {
        s["role"] == "replica" && s["streaming"] == true && s["following"] == "it-0"
    })
    .await;
    let asked = dns.asked();
    let primary_name = format!("it-0.{STATEFULSET}.{NAMESPACE}.svc.cluster.local");
    assert!(asked.contains(&primary_name), "{asked:?}");
}

/// The static binary: built once per test process, unless `PGKUBE_STATIC_BINARY` names one.
fn static_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os("PGKUBE_STATIC_BINARY") {
            return PathBuf::from(path);
        }
        let target_dir = std::env::var_os("PGKUBE_MUSL_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                // <target dir>/debug/pgkube, the binary cargo built for the tests.
                let own = Path::new(env!("CARGO_BIN_EXE_pgkube"));
                own.ancestors().nth(2).expect("a target dir").join("musl")
            });
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build", "--quiet", "--locked", "--bin", "pgkube", "--target",
            ])
            .arg(TARGET)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("CARGO_TARGET_DIR", &target_dir)
            .status()
            .expect("cargo runs");
        assert!(
            status.success(),
            "the static build failed; it needs `rustup target add {TARGET}` and musl-gcc \
             (Debian's musl-tools)"
        );
        target_dir.join(TARGET).join("debug/pgkube")
    })
}

/// A root filesystem holding PostgreSQL only, and beside it pgkube's image.
struct PostgresRoot {
    dir: PathBuf,
    image: PathBuf,
}

impl PostgresRoot {
    fn build() -> Self {
        let dir = std::env::temp_dir().join(unique_name("pgkube-postgres-root"));
        let image = std::env::temp_dir().join(unique_name("pgkube-image"));
        let root = Self { dir, image };
        let bin = format!("usr/lib/postgresql/{MAJOR}/bin");
        let lib = format!("usr/lib/postgresql/{MAJOR}/lib");
        for sub in [
            &bin,
            &lib,
            "usr/share/postgresql",
            "bin",
            "etc",
            "dev/shm",
            "tmp",
        ] {
            std::fs::create_dir_all(root.dir.join(sub)).expect("a directory");
        }
        // Mount points: /proc for unshare, /controller for the pod's shared volume.
        for sub in ["proc", "controller"] {
            std::fs::create_dir(root.dir.join(sub)).expect("a directory");
        }
        let mut programs: Vec<(PathBuf, String)> = PROGRAMS
            .iter()
            .map(|name| {
                (
                    Path::new("/").join(&bin).join(name),
                    format!("{bin}/{name}"),
                )
            })
            .collect();
        let shell = std::fs::canonicalize("/bin/sh").expect("/bin/sh");
        programs.push((shell, "bin/sh".to_owned()));
        let mut objects = programs.clone();
        objects.extend(server_modules(&lib));
        let host_loader = interpreter(&std::fs::read(&programs[0].0).expect("postgres"))
            .expect("postgres has an interpreter");
        let mut libraries = std::collections::BTreeSet::new();
        for (from, to) in &objects {
            std::fs::copy(from, root.dir.join(to)).expect("a copy");
            libraries.extend(libraries_of(from));
        }
        libraries.retain(|library| {
            !library.ends_with(Path::new(&host_loader).file_name().expect("a name"))
        });
        for library in &libraries {
            let to = root
                .dir
                .join(library.strip_prefix("/").expect("an absolute path"));
            std::fs::create_dir_all(to.parent().expect("a directory")).expect("a directory");
            std::fs::copy(library, to).expect("a copy of a library");
        }
        std::fs::copy(&host_loader, root.dir.join(&LOADER[1..])).expect("the loader");
        for (_, to) in &programs {
            set_interpreter(&root.dir.join(to), LOADER);
        }
        // What makes a dynamically linked pgkube fail here: no loader where it looks.
        assert!(
            !root.dir.join(&host_loader[1..]).exists(),
            "{host_loader} is in the root"
        );
        for dir in [
            format!("/usr/share/postgresql/{MAJOR}"),
            "/usr/share/zoneinfo".to_owned(),
            // The managers' locale (C.UTF-8).
            "/usr/lib/locale/C.utf8".to_owned(),
        ] {
            let parent = root
                .dir
                .join(Path::new(&dir[1..]).parent().expect("a parent"));
            std::fs::create_dir_all(&parent).expect("a directory");
            run(Command::new("cp").arg("-a").arg(&dir).arg(parent));
        }
        root.write_system_files();
        root
    }

    /// The users, name service and device files an image has, and its sticky temporary dirs.
    fn write_system_files(&self) {
        let id = POSTGRES_ID;
        for (file, text) in [
            (
                "etc/passwd",
                format!("root:x:0:0::/root:/bin/sh\npostgres:x:{id}:{id}::/tmp:/bin/sh\n"),
            ),
            ("etc/group", format!("root:x:0:\npostgres:x:{id}:\n")),
            (
                "etc/nsswitch.conf",
                "passwd: files\ngroup: files\nhosts: files dns\n".to_owned(),
            ),
            ("etc/hosts", "127.0.0.1 localhost\n".to_owned()),
        ] {
            std::fs::write(self.dir.join(file), text).expect("a system file");
        }
        for (name, minor) in [
            ("null", "3"),
            ("zero", "5"),
            ("random", "8"),
            ("urandom", "9"),
        ] {
            run(Command::new("mknod")
                .args(["-m", "666"])
                .arg(self.dir.join("dev").join(name))
                .args(["c", "1", minor]));
        }
        run(Command::new("chmod")
            .arg("1777")
            .arg(self.dir.join("tmp"))
            .arg(self.dir.join("dev/shm")));
        run(Command::new("chown")
            .arg(format!("{POSTGRES_ID}:{POSTGRES_ID}"))
            .arg(self.dir.join("controller")));
    }

    /// What the init container does: from an image holding only `binary`, `pgkube instance
    /// install` copies it into the shared volume, which is then this root's `/controller`.
    fn install_from_image(&self, binary: &Path) {
        for sub in ["usr/local/bin", "proc", "controller"] {
            std::fs::create_dir_all(self.image.join(sub)).expect("a directory");
        }
        std::fs::copy(binary, self.image.join("usr/local/bin/pgkube")).expect("a copy");
        run(Command::new("chown")
            .arg(format!("{POSTGRES_ID}:{POSTGRES_ID}"))
            .arg(self.image.join("controller")));
        run(Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc"])
            .arg(format!("--root={}", self.image.display()))
            .args(["--setuid", &POSTGRES_ID.to_string()])
            .args(["--setgid", &POSTGRES_ID.to_string()])
            .args(["--", "/usr/local/bin/pgkube", "instance", "install"])
            .arg("/controller/pgkube")
            .env_clear());
        std::fs::rename(
            self.image.join("controller/pgkube"),
            self.dir.join("controller/pgkube"),
        )
        .expect("the installed binary moves to the PostgreSQL root");
    }

    fn chroot(&self) -> Chroot {
        Chroot {
            root: self.dir.clone(),
            binary: "/controller/pgkube".to_owned(),
            id: POSTGRES_ID,
            path: format!("/usr/lib/postgresql/{MAJOR}/bin:/bin"),
            env: Vec::new(),
        }
    }
}

impl Drop for PostgresRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.image);
    }
}

/// The server's loadable modules (`$libdir`), but the JIT's, which would bring LLVM.
fn server_modules(lib: &str) -> Vec<(PathBuf, String)> {
    let host = Path::new("/").join(lib);
    let entries = std::fs::read_dir(&host).expect("PostgreSQL's lib directory");
    entries
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".so") && !name.starts_with("llvmjit"))
        .map(|name| (host.join(&name), format!("{lib}/{name}")))
        .collect()
}

/// The shared libraries `object` loads, as `ldd` finds them on this machine.
fn libraries_of(object: &Path) -> Vec<PathBuf> {
    let output = Command::new("ldd").arg(object).output().expect("ldd runs");
    assert!(output.status.success(), "ldd {}", object.display());
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_once("=> ")?.1.split_whitespace().next())
        .filter(|path| path.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// The namespace of the pods' DNS names.
const NAMESPACE: &str = "ns";
/// The DNS server's address, port 53 (resolv.conf has no port).
const DNS_ADDRESS: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 53, 53);

/// A DNS server as a cluster's: A records for the instances' pod names in `cluster.local`, no
/// other name (NXDOMAIN), and a root filesystem's resolv.conf as a pod's in [`NAMESPACE`].
struct Dns {
    asked: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Dns {
    async fn start(root: &Path) -> Self {
        let domains = format!("{NAMESPACE}.svc.cluster.local svc.cluster.local cluster.local");
        std::fs::write(
            root.join("etc/resolv.conf"),
            format!("nameserver {DNS_ADDRESS}\nsearch {domains}\noptions ndots:5\n"),
        )
        .expect("resolv.conf");
        let records: HashMap<String, Ipv4Addr> = (0..usize::from(MAX_INSTANCES))
            .map(|ordinal| {
                let name = format!("{STATEFULSET}-{ordinal}.{STATEFULSET}.{NAMESPACE}");
                (format!("{name}.svc.cluster.local"), address_of(ordinal))
            })
            .collect();
        let socket = tokio::net::UdpSocket::bind((DNS_ADDRESS, 53))
            .await
            .expect("port 53 is free on the DNS server's address");
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&asked);
        let task = tokio::spawn(async move {
            let mut buffer = [0; 512];
            while let Ok((length, from)) = socket.recv_from(&mut buffer).await {
                if let Some((name, reply)) = dns_reply(&buffer[..length], &records) {
                    seen.lock().expect("the names").push(name);
                    let _ = socket.send_to(&reply, from).await;
                }
            }
        });
        Self { asked, task }
    }

    /// The names asked for so far.
    fn asked(&self) -> Vec<String> {
        self.asked.lock().expect("the names").clone()
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The name a DNS query asks for and the answer: its A record when `records` has it (no record
/// of another type), NXDOMAIN when it does not. None for what is not a query of one question.
fn dns_reply(query: &[u8], records: &HashMap<String, Ipv4Addr>) -> Option<(String, Vec<u8>)> {
    const TYPE_A: [u8; 2] = [0, 1];
    if query.len() < 12 || query[2] & 0x80 != 0 || query[4..6] != [0, 1] {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let length = usize::from(*query.get(at)?);
        at += 1;
        if length == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + length)?).to_ascii_lowercase());
        at += length;
    }
    let kind = query.get(at..at + 2)?;
    let question_end = at + 4;
    let name = labels.join(".");
    let address = records.get(&name);
    let mut reply = query.get(..question_end)?.to_vec();
    // A response, authoritative, recursion as asked and available; NXDOMAIN for an unknown name.
    reply[2] = 0x84 | (query[2] & 0x01);
    reply[3] = 0x80 | if address.is_some() { 0 } else { 3 };
    reply[6..12].fill(0);
    if let (Some(address), true) = (address, kind == TYPE_A) {
        reply[7] = 1;
        // The question's name (a pointer to offset 12), A, IN, 30 s, 4 bytes of address.
        reply.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4]);
        reply.extend_from_slice(&address.octets());
    }
    Some((name, reply))
}

fn run(command: &mut Command) {
    let status = command.status().expect("the command runs");
    assert!(status.success(), "{command:?}: {status}");
}

// ELF (64-bit, little-endian): what a file asks of the system to run.
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;

/// A segment's type and where it lies in the file.
struct Segment {
    kind: u32,
    offset: usize,
    size: usize,
}

fn word(bytes: &[u8], at: usize, width: usize) -> u64 {
    let mut value = [0; 8];
    value[..width].copy_from_slice(&bytes[at..at + width]);
    u64::from_le_bytes(value)
}

fn offset(bytes: &[u8], at: usize) -> usize {
    usize::try_from(word(bytes, at, 8)).expect("an offset")
}

fn segments(bytes: &[u8]) -> Vec<Segment> {
    assert_eq!(
        &bytes[..6],
        b"\x7fELF\x02\x01",
        "a 64-bit little-endian ELF file"
    );
    let table = offset(bytes, 0x20);
    let entry_size = word(bytes, 0x36, 2);
    let entries = word(bytes, 0x38, 2);
    (0..entries)
        .map(|index| {
            let header = table + usize::try_from(index * entry_size).expect("an offset");
            Segment {
                kind: u32::try_from(word(bytes, header, 4)).expect("a type"),
                offset: offset(bytes, header + 8),
                size: offset(bytes, header + 0x20),
            }
        })
        .collect()
}

/// The program interpreter (dynamic loader) the file names.
fn interpreter(bytes: &[u8]) -> Option<String> {
    let segment = segments(bytes).into_iter().find(|s| s.kind == PT_INTERP)?;
    let path = &bytes[segment.offset..segment.offset + segment.size];
    let end = path.iter().position(|&b| b == 0).unwrap_or(path.len());
    Some(String::from_utf8_lossy(&path[..end]).into_owned())
}

/// How many shared libraries the file needs (a static PIE has a dynamic section for its own
/// relocations, but needs none).
fn needed_libraries(bytes: &[u8]) -> usize {
    let Some(dynamic) = segments(bytes).into_iter().find(|s| s.kind == PT_DYNAMIC) else {
        return 0;
    };
    (dynamic.offset..dynamic.offset + dynamic.size)
        .step_by(16)
        .map(|entry| word(bytes, entry, 8))
        .take_while(|&tag| tag != DT_NULL)
        .filter(|&tag| tag == DT_NEEDED)
        .count()
}

/// Points the program at `file` to the loader at `loader`, which must fit in place.
fn set_interpreter(file: &Path, loader: &str) {
    let mut bytes = std::fs::read(file).expect("the program reads");
    let segment = segments(&bytes)
        .into_iter()
        .find(|s| s.kind == PT_INTERP)
        .expect("a program interpreter");
    assert!(loader.len() < segment.size, "{loader} does not fit");
    let room = &mut bytes[segment.offset..segment.offset + segment.size];
    room.fill(0);
    room[..loader.len()].copy_from_slice(loader.as_bytes());
    std::fs::write(file, bytes).expect("the program writes");
}
