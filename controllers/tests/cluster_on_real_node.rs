//! End to end on the test bed's real node `testbed-local`: the cluster controller's
//! StatefulSet pod really runs PostgreSQL 15 there under the instance manager, the pod becomes
//! Ready because the instance manager's real `/readyz` probe passes, the generated password
//! really logs in (through the `-rw` Service, once the controller labelled the pod primary), and
//! the data volume keeps the rows when the pod is deleted and the StatefulSet makes it again.

mod common;

use std::time::Duration;

use common::Running;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::DeleteParams;
use pgkube_testkit::tokio_postgres;
use pgkube_testkit::{LOCAL_NODE, TestCluster, wait_until};

const RESYNC: Duration = Duration::from_secs(30);
const POD_BACK_TIMEOUT: Duration = Duration::from_secs(180);

#[tokio::test]
async fn a_version_15_cluster_on_the_real_node_serves_sql_and_keeps_its_rows_across_a_pod_restart()
{
    let Some(running) = Running::start("real-node", RESYNC).await else {
        return;
    };
    let cluster = TestCluster::builder("pg")
        .start(&running.namespace)
        .await
        .expect("the cluster becomes Running on the real node");

    let pods = running.api::<Pod>();
    let pod = pods.get("pg-postgresql-0").await.expect("the instance pod");
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(LOCAL_NODE)
    );

    let sql = cluster
        .sql()
        .await
        .expect("login with the Secret's password");
    sql.batch_execute(
        "CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL);
         INSERT INTO notes VALUES (1, 'survives a restart');",
    )
    .await
    .expect("a table and a row");
    let version: String = sql
        .query_one("SHOW server_version_num", &[])
        .await
        .expect("server version")
        .get(0);
    assert!(version.starts_with("15"), "server_version_num {version}");
    drop(sql);

    // Applications get their own role and database: the application Secret's `uri` logs in
    // (verify-full against the name it gives) and its owner can create tables there.
    let address = cluster.addresses().await.expect("addresses")[0];
    let application = cluster.application_secret().await.expect("the app Secret");
    assert_eq!(
        (application.username.as_str(), application.dbname.as_str()),
        ("app", "app")
    );
    let mut config: tokio_postgres::Config = application.uri.parse().expect("the uri parses");
    let (app, connection) = config
        .hostaddr(address.ip())
        .ssl_mode(tokio_postgres::config::SslMode::Require)
        .connect(cluster.tls().await.expect("the cluster's CA"))
        .await
        .expect("the app Secret's uri logs in");
    tokio::spawn(connection);
    let (user, database): (String, String) = app
        .query_one("SELECT current_user::text, current_database()::text", &[])
        .await
        .map(|row| (row.get(0), row.get(1)))
        .expect("who and where");
    assert_eq!((user.as_str(), database.as_str()), ("app", "app"));
    app.batch_execute("CREATE TABLE orders (id int)")
        .await
        .expect("the owner creates a table in its database");

    // The password is checked: the same user with another password is refused.
    let refused = cluster
        .log_in(address, "app", "not-the-password")
        .await
        .expect("the cluster's CA")
        .expect_err("a wrong password is refused");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::INVALID_PASSWORD),
        "{refused:?}"
    );

    // The superuser's own password does not log in over the network: remote superuser logins
    // need the client certificate the operator issued (spec.enableSuperuserAccess is off).
    let (superuser, password) = cluster.credentials().await.expect("credentials");
    let refused = cluster
        .log_in(address, &superuser, &password)
        .await
        .expect("the cluster's CA")
        .expect_err("a remote superuser login with its password is refused");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION),
        "{refused:?}"
    );

    let old_uid = pod.uid().expect("pod uid");
    pods.delete("pg-postgresql-0", &DeleteParams::default())
        .await
        .expect("pod deleted");
    wait_until("a new pg-postgresql-0, Ready", POD_BACK_TIMEOUT, || async {
        let Some(pod) = pods.get_opt("pg-postgresql-0").await? else {
            return Ok(None);
        };
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        Ok((pod.uid() != Some(old_uid.clone()) && ready).then_some(()))
    })
    .await
    .expect("the StatefulSet makes the pod again");
    cluster
        .wait_running(POD_BACK_TIMEOUT)
        .await
        .expect("the cluster is Running again");

    let sql = cluster.sql().await.expect("login after the restart");
    let body: String = sql
        .query_one("SELECT body FROM notes WHERE id = 1", &[])
        .await
        .expect("the row")
        .get(0);
    assert_eq!(body, "survives a restart");
    drop(sql);
    running.stop().await;
}

/// Deleting a cluster keeps its data volume and its credentials Secret; a cluster made again
/// under the same name runs on that data, and the password in the Secret still logs in.
#[tokio::test]
async fn a_cluster_made_again_under_the_same_name_finds_its_data_and_its_password() {
    let Some(running) = Running::start("real-node-again", RESYNC).await else {
        return;
    };
    let first = TestCluster::builder("pg")
        .start(&running.namespace)
        .await
        .expect("the first cluster becomes Running");
    first
        .sql()
        .await
        .expect("login to the first cluster")
        .batch_execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('from the first');")
        .await
        .expect("a row");
    let (_, password) = first.credentials().await.expect("credentials");
    first
        .delete(POD_BACK_TIMEOUT)
        .await
        .expect("the first cluster is deleted");

    let again = TestCluster::builder("pg")
        .start(&running.namespace)
        .await
        .expect("the cluster made again becomes Running");
    let (_, password_again) = again.credentials().await.expect("credentials");
    assert_eq!(password_again, password, "the Secret was kept, not remade");
    let value: String = again
        .sql()
        .await
        .expect("the kept password logs in to the kept data")
        .query_one("SELECT v FROM kept", &[])
        .await
        .expect("the row")
        .get(0);
    assert_eq!(value, "from the first");
    running.stop().await;
}

/// `spec.postgresql.parameters` reach the server, and so does a change of them: the instance
/// manager applies the new configuration file (a reload here), and the pod is not replaced.
#[tokio::test]
async fn a_parameter_and_its_change_reach_the_server() {
    let Some(running) = Running::start("real-node-params", RESYNC).await else {
        return;
    };
    let cluster = TestCluster::builder("pg")
        .spec(|spec| {
            spec.postgresql = Some(pgkube_crds::PostgreSQLSettings {
                parameters: [("work_mem".to_owned(), "8MB".to_owned())].into(),
            });
        })
        .start(&running.namespace)
        .await
        .expect("the cluster becomes Running");
    let setting = |cluster: TestCluster| async move {
        let row = cluster.sql().await?.query_one("SHOW work_mem", &[]).await?;
        anyhow::Ok(row.get::<_, String>(0))
    };
    assert_eq!(
        setting(cluster.clone()).await.expect("SHOW work_mem"),
        "8MB"
    );
    let pods = running.api::<Pod>();
    let pod_uid = pods.get("pg-postgresql-0").await.expect("pod").uid();

    cluster
        .api()
        .patch(
            cluster.name(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "spec": { "postgresql": { "parameters": { "work_mem": "16MB" } } }
            })),
        )
        .await
        .expect("parameters changed");
    wait_until("work_mem = 16MB on the server", POD_BACK_TIMEOUT, || {
        let cluster = cluster.clone();
        async move {
            // While the server reloads or restarts, a connection may fail: that is "not yet".
            Ok(setting(cluster).await.ok().filter(|v| v == "16MB"))
        }
    })
    .await
    .expect("the change reaches the server");
    assert_eq!(
        pods.get("pg-postgresql-0").await.expect("pod").uid(),
        pod_uid,
        "a configuration change does not roll the pods"
    );
    running.stop().await;
}
