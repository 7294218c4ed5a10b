//! Pieces of pod specs that every pod pgkube makes shares: the restricted security context, and
//! the init container that copies `pgkube` out of its image into a volume, so that a container
//! running another image (PostgreSQL's) can run it.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, SeccompProfile, SecurityContext, VolumeMount,
};

/// The container runtime's default seccomp profile.
pub fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_owned(),
        ..SeccompProfile::default()
    }
}

/// Restricted: no privilege escalation, no capability, not root, the runtime's seccomp profile,
/// and a read-only root filesystem (writes go to volumes).
pub fn restricted_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            ..Capabilities::default()
        }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..SecurityContext::default()
    }
}

/// `volume` mounted at `path`.
pub fn mount(volume: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: volume.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

/// An init container named `name` that copies `pgkube` from pgkube's `image` (whose entrypoint
/// is `pgkube`) to `destination`, a path inside `volume` mounted at `mount_path`.
pub fn install_pgkube_container(
    name: &str,
    image: &str,
    volume: &str,
    mount_path: &str,
    destination: &str,
) -> Container {
    Container {
        name: name.to_owned(),
        image: Some(image.to_owned()),
        args: Some(
            ["instance", "install", destination]
                .map(str::to_owned)
                .to_vec(),
        ),
        security_context: Some(restricted_security_context()),
        volume_mounts: Some(vec![mount(volume, mount_path, false)]),
        ..Container::default()
    }
}
