//! The start-up CRD check against the test bed's real API server: installed CRDs pass, a
//! missing one is named with the install command, and it works for a manager that only has
//! namespaced rights (which cannot read CustomResourceDefinitions), while a manager without
//! the rights gets an RBAC message instead of "not installed".

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{ApiResource, ObjectMeta, PostParams};
use kube::{Api, Client};
use pgkube_controllers::crd_check::{
    CrdCheckError, INSTALL_COMMAND, ensure_crds_installed, ensure_installed, pgkube_kinds,
};
use pgkube_testkit::{TestEnv, TestNamespace, install_crds, testbed};

#[tokio::test]
async fn installed_crds_pass_and_a_missing_one_is_named() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    ensure_crds_installed(&client, &[])
        .await
        .expect("installed CRDs pass, watching all namespaces");
    ensure_crds_installed(&client, &["default".to_owned()])
        .await
        .expect("installed CRDs pass, watching one namespace");

    let absent = ApiResource {
        group: "missing.pgkube.dev".to_owned(),
        version: "v1".to_owned(),
        api_version: "missing.pgkube.dev/v1".to_owned(),
        kind: "Widget".to_owned(),
        plural: "widgets".to_owned(),
    };
    let mut kinds = pgkube_kinds();
    kinds.insert(1, absent);
    let error = ensure_installed(&client, &["default".to_owned(), "other".to_owned()], &kinds)
        .await
        .expect_err("the absent CRD is reported");
    assert!(matches!(error, CrdCheckError::Missing { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("widgets.missing.pgkube.dev"), "{message}");
    assert!(
        !message.contains("postgresqlclusters.db.example.com"),
        "{message}"
    );
    assert!(message.contains(INSTALL_COMMAND), "{message}");
}

#[tokio::test]
async fn namespaced_rights_suffice_and_missing_rights_are_an_rbac_error() {
    let Some(env) = testbed() else { return };
    let admin = env.kube_client().await;
    install_crds(&admin).await;
    let namespace = TestNamespace::create(&admin, "crd-check").await;
    let ns = namespace.name().to_owned();
    let manager = service_account_client(&env, &admin, &ns, "checker").await;

    // No rights at all: a clear RBAC message, not "not installed".
    let error = ensure_crds_installed(&manager, std::slice::from_ref(&ns))
        .await
        .expect_err("a manager without rights is refused");
    let message = error.to_string();
    assert!(
        matches!(error, CrdCheckError::Forbidden { .. }),
        "{message}"
    );
    assert!(
        message.contains("may not list postgresqlclusters.db.example.com")
            && message.contains(&format!("in namespace {ns}")),
        "{message}"
    );

    // Rights in the watched namespace only (no cluster-wide rights, none on CRDs): it passes.
    grant_list_in_namespace(&admin, &ns, "checker").await;
    pgkube_testkit::wait_until(
        "the Role to take effect",
        std::time::Duration::from_secs(30),
        || async {
            Ok(ensure_crds_installed(&manager, std::slice::from_ref(&ns))
                .await
                .ok())
        },
    )
    .await
    .expect("namespaced rights suffice");
    // Watching all namespaces needs cluster-wide rights, and says so.
    let error = ensure_crds_installed(&manager, &[])
        .await
        .expect_err("no cluster-wide rights");
    assert!(error.to_string().contains("in all namespaces"), "{error}");
    namespace.cleanup().await;
}

/// A client authenticated as a new ServiceAccount `name` in `namespace`.
async fn service_account_client(
    env: &TestEnv,
    admin: &Client,
    namespace: &str,
    name: &str,
) -> Client {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    accounts
        .create(&PostParams::default(), &account)
        .await
        .expect("ServiceAccount created");
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("token issued")
        .status
        .expect("token status")
        .token;
    env.kube_client_with_token(&token).await
}

/// Lets ServiceAccount `account` list the pgkube kinds in `namespace`, and nothing else.
async fn grant_list_in_namespace(admin: &Client, namespace: &str, account: &str) {
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    };
    let role = Role {
        metadata: meta("list-pgkube-kinds"),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![pgkube_crds::GROUP.to_owned()]),
            resources: Some(pgkube_kinds().into_iter().map(|k| k.plural).collect()),
            verbs: vec!["list".to_owned()],
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await
        .expect("Role created");
    let binding = RoleBinding {
        metadata: meta("list-pgkube-kinds"),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "Role".to_owned(),
            name: "list-pgkube-kinds".to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: account.to_owned(),
            namespace: Some(namespace.to_owned()),
            ..Subject::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("RoleBinding created");
}
