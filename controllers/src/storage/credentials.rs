//! Where the S3 client's credentials come from.
//!
//! Either static keys, given explicitly (a Secret's values, or the standard `AWS_*` variables or
//! key files in the environment), with a session token when they are temporary ones (STS
//! `AssumeRole`, `GetSessionToken`, ...); or, when no key is given at all, the AWS SDK's default
//! chain, which tries in order: the `AWS_*` environment variables, the shared profile files
//! (`~/.aws/credentials`, `~/.aws/config`, `AWS_PROFILE`), web identity (`AWS_WEB_IDENTITY_TOKEN_FILE`
//! with `AWS_ROLE_ARN`: IAM roles for service accounts on EKS, through STS
//! `AssumeRoleWithWebIdentity`), container credentials (`AWS_CONTAINER_CREDENTIALS_*`: ECS, EKS
//! Pod Identity) and EC2 instance metadata (IMDSv2). Credentials from the chain are refreshed
//! before they expire. Profiles that need `credential_process` or AWS SSO are not supported: they
//! would pull in SDK features no pod needs.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use aws_sdk_s3::config::Credentials;

use super::error::StorageError;

/// File holding the access key id (a mounted Secret); wins over `AWS_ACCESS_KEY_ID`.
pub const ACCESS_KEY_ID_FILE_VARIABLE: &str = "PGKUBE_S3_ACCESS_KEY_ID_FILE";
/// File holding the secret access key; wins over `AWS_SECRET_ACCESS_KEY`.
pub const SECRET_ACCESS_KEY_FILE_VARIABLE: &str = "PGKUBE_S3_SECRET_ACCESS_KEY_FILE";
/// File holding the session token of temporary keys; wins over `AWS_SESSION_TOKEN`.
pub const SESSION_TOKEN_FILE_VARIABLE: &str = "PGKUBE_S3_SESSION_TOKEN_FILE";

/// How the client authenticates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CredentialSource {
    /// Keys given explicitly.
    Static(StaticKeys),
    /// The AWS SDK's default credential chain (see the module documentation).
    #[default]
    DefaultChain,
}

/// An access key pair, with the session token that temporary keys come with.
#[derive(Clone, PartialEq, Eq)]
pub struct StaticKeys {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

/// Never prints a key: `Debug` output can end up in logs.
impl fmt::Debug for StaticKeys {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("StaticKeys")
            .field("session_token", &self.session_token.is_some())
            .finish_non_exhaustive()
    }
}

impl CredentialSource {
    /// From this process's environment: the key files named by [`ACCESS_KEY_ID_FILE_VARIABLE`],
    /// [`SECRET_ACCESS_KEY_FILE_VARIABLE`] and [`SESSION_TOKEN_FILE_VARIABLE`], else
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`; with neither key,
    /// the default chain. Half a key pair, or a session token without keys, is refused: the
    /// default chain would silently look elsewhere.
    pub fn from_env() -> Result<Self, StorageError> {
        Self::from_lookup(&|name| std::env::var_os(name))
    }

    /// [`CredentialSource::from_env`] over any variable lookup (tests pass a map).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<OsString>) -> Result<Self, StorageError> {
        let access_key_id = read_secret(lookup, "AWS_ACCESS_KEY_ID", ACCESS_KEY_ID_FILE_VARIABLE)?;
        let secret_access_key = read_secret(
            lookup,
            "AWS_SECRET_ACCESS_KEY",
            SECRET_ACCESS_KEY_FILE_VARIABLE,
        )?;
        let session_token = read_secret(lookup, "AWS_SESSION_TOKEN", SESSION_TOKEN_FILE_VARIABLE)?
            .filter(|token| !token.is_empty());
        match (access_key_id, secret_access_key, session_token) {
            (Some(access_key_id), Some(secret_access_key), session_token) => {
                Ok(Self::Static(StaticKeys {
                    access_key_id,
                    secret_access_key,
                    session_token,
                }))
            }
            (None, None, None) => Ok(Self::DefaultChain),
            (None, None, Some(_)) => Err(StorageError::Settings(
                "an S3 session token needs the access key id and secret access key it was issued \
                 with (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or their PGKUBE_S3_*_FILE)"
                    .into(),
            )),
            _ => Err(StorageError::Settings(
                "S3 access key id and secret access key must be given together".into(),
            )),
        }
    }

    /// The keys as the SDK's provider, or `None` to leave the default chain in charge.
    pub(super) fn static_credentials(&self) -> Option<Credentials> {
        match self {
            Self::Static(keys) => Some(Credentials::new(
                &keys.access_key_id,
                &keys.secret_access_key,
                keys.session_token.clone(),
                None,
                "pgkube-static",
            )),
            Self::DefaultChain => None,
        }
    }
}

/// The value of `file_variable`'s file (trailing newline removed) or else of `variable` (unless
/// empty), from this process's environment.
pub fn secret_from_env_or_file(
    variable: &str,
    file_variable: &str,
) -> Result<Option<String>, StorageError> {
    read_secret(&|name| std::env::var_os(name), variable, file_variable)
}

fn read_secret(
    lookup: &dyn Fn(&str) -> Option<OsString>,
    variable: &str,
    file_variable: &str,
) -> Result<Option<String>, StorageError> {
    if let Some(path) = lookup(file_variable) {
        let path = PathBuf::from(path);
        let content = std::fs::read_to_string(&path)
            .map_err(|source| StorageError::ReadFile { path, source })?;
        return Ok(Some(content.trim_end_matches(['\r', '\n']).to_string()));
    }
    Ok(lookup(variable)
        .and_then(|value| value.into_string().ok())
        .filter(|value| !value.is_empty()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use aws_sdk_s3::config::ProvideCredentials;

    use super::*;

    fn choose(variables: &[(&str, &str)]) -> Result<CredentialSource, StorageError> {
        let variables: HashMap<String, OsString> = variables
            .iter()
            .map(|(name, value)| (name.to_string(), OsString::from(value)))
            .collect();
        CredentialSource::from_lookup(&|name| variables.get(name).cloned())
    }

    fn keys(access: &str, secret: &str, token: Option<&str>) -> CredentialSource {
        CredentialSource::Static(StaticKeys {
            access_key_id: access.into(),
            secret_access_key: secret.into(),
            session_token: token.map(str::to_string),
        })
    }

    fn write(dir: &Path, name: &str, content: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, content).expect("writing a key file");
        path.to_string_lossy().into_owned()
    }

    #[test]
    fn without_keys_the_default_chain_is_used() {
        assert_eq!(choose(&[]).ok(), Some(CredentialSource::DefaultChain));
        // Empty variables count as absent, as the SDK's own environment provider has it.
        let empty = choose(&[("AWS_ACCESS_KEY_ID", ""), ("AWS_SESSION_TOKEN", "")]);
        assert_eq!(empty.ok(), Some(CredentialSource::DefaultChain));
        // Whatever the chain would find there (web identity, a profile) is its business.
        let irsa = choose(&[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/secrets/token"),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/backup"),
        ]);
        assert_eq!(irsa.ok(), Some(CredentialSource::DefaultChain));
    }

    #[test]
    fn static_keys_from_the_environment_carry_the_session_token() {
        let permanent = choose(&[("AWS_ACCESS_KEY_ID", "AK"), ("AWS_SECRET_ACCESS_KEY", "SK")]);
        assert_eq!(permanent.ok(), Some(keys("AK", "SK", None)));
        let temporary = choose(&[
            ("AWS_ACCESS_KEY_ID", "ASIA"),
            ("AWS_SECRET_ACCESS_KEY", "SK"),
            ("AWS_SESSION_TOKEN", "TOKEN"),
        ]);
        assert_eq!(temporary.ok(), Some(keys("ASIA", "SK", Some("TOKEN"))));
    }

    #[test]
    fn key_files_win_over_variables_and_lose_their_trailing_newline() {
        let dir = std::env::temp_dir().join(format!("pgkube-credentials-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let access = write(&dir, "access", "ASIAFILE\n");
        let secret = write(&dir, "secret", "SKFILE\r\n");
        let token = write(&dir, "token", "TOKENFILE\n");
        let chosen = choose(&[
            ("AWS_ACCESS_KEY_ID", "ignored"),
            ("AWS_SESSION_TOKEN", "ignored"),
            (ACCESS_KEY_ID_FILE_VARIABLE, &access),
            (SECRET_ACCESS_KEY_FILE_VARIABLE, &secret),
            (SESSION_TOKEN_FILE_VARIABLE, &token),
        ]);
        assert_eq!(
            chosen.ok(),
            Some(keys("ASIAFILE", "SKFILE", Some("TOKENFILE")))
        );
        let missing = choose(&[(SESSION_TOKEN_FILE_VARIABLE, "/nonexistent/token")]);
        assert!(matches!(missing, Err(StorageError::ReadFile { .. })));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn half_a_key_pair_or_a_lone_token_is_refused() {
        let half = choose(&[("AWS_ACCESS_KEY_ID", "AK"), ("AWS_SESSION_TOKEN", "T")]);
        let message = half.expect_err("half a pair").to_string();
        assert!(message.contains("must be given together"), "{message}");
        let lone = choose(&[("AWS_SESSION_TOKEN", "TOKEN")]);
        let message = lone.expect_err("lone token").to_string();
        assert!(message.contains("session token needs"), "{message}");
        assert!(!message.contains("TOKEN\""), "{message}");
    }

    #[test]
    fn debug_output_shows_no_key() {
        let printed = format!("{:?}", keys("ASIAKEYID", "SECRETKEY", Some("SESSIONTOKEN")));
        for secret in ["ASIAKEYID", "SECRETKEY", "SESSIONTOKEN"] {
            assert!(!printed.contains(secret), "{printed}");
        }
    }

    #[tokio::test]
    async fn the_provider_hands_out_the_session_token() {
        let provider = keys("ASIA", "SK", Some("TOKEN"))
            .static_credentials()
            .expect("static keys give a provider");
        let credentials = provider.provide_credentials().await.expect("credentials");
        assert_eq!(credentials.access_key_id(), "ASIA");
        assert_eq!(credentials.session_token(), Some("TOKEN"));
        assert!(
            CredentialSource::DefaultChain
                .static_credentials()
                .is_none()
        );
    }
}
