//! The `pgkube` binary: the manager (`pgkube run`), CRD generation and the backup agent.

fn main() {
    println!("pgkube");
}
