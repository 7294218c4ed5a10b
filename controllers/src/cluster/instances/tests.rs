//! Unit tests of the instance reports: parsing, staleness, and asking pods over HTTP.

use super::http::Served;
use super::*;
use k8s_openapi::api::core::v1::PodStatus;
use std::collections::BTreeMap;

#[test]
fn lsns_parse_as_postgresql_writes_them() {
    assert_eq!("0/3000148".parse(), Ok(Lsn(0x0300_0148)));
    assert_eq!("16/B374D848".parse(), Ok(Lsn((0x16 << 32) | 0xB374_D848)));
    assert_eq!(
        "FFFFFFFF/FFFFFFFF".parse::<Lsn>().map(|l| l.0),
        Ok(u64::MAX)
    );
    for bad in [
        "",
        "0",
        "/1",
        "1/",
        "0/3000148/1",
        "G/1",
        "100000000/0",
        "0x1/2",
    ] {
        assert!(bad.parse::<Lsn>().is_err(), "{bad:?} parsed");
    }
    assert_eq!(Lsn((0x16 << 32) | 0xB374_D848).to_string(), "16/B374D848");
}

#[test]
fn lag_saturates_at_zero() {
    let primary = Lsn(0x0300_0148);
    assert_eq!(primary.bytes_after(Lsn(0x0300_0100)), 0x48);
    assert_eq!(Lsn(0x0300_0100).bytes_after(primary), 0);
    let across_segments: Lsn = "1/0".parse().expect("lsn");
    assert_eq!(
        across_segments.bytes_after("0/FFFFFFFF".parse().expect("lsn")),
        1
    );
}

#[test]
fn a_report_parses_from_the_contract_s_json() {
    let replica: InstanceReport = serde_json::from_str(
        r#"{"pod":"x-postgresql-1","role":"replica","ready":true,"timeline":1,
            "currentLsn":null,"receivedLsn":"0/3000148","replayedLsn":"0/3000100",
            "streaming":true,"pendingRestart":[]}"#,
    )
    .expect("parses");
    assert_eq!(replica.role, ReportedRole::Replica);
    assert_eq!(replica.current_lsn, None);
    assert_eq!(replica.replayed_lsn, Some(Lsn(0x0300_0100)));
    assert!(replica.streaming);
    let starting: InstanceReport =
        serde_json::from_str(r#"{"pod":"p","role":"starting","ready":false}"#)
            .expect("optional fields may be missing");
    assert_eq!(starting.role, ReportedRole::Starting);
    let future: InstanceReport =
        serde_json::from_str(r#"{"pod":"p","role":"demoting","ready":false}"#)
            .expect("an unknown role");
    assert_eq!(future.role, ReportedRole::Starting);
    let bad_lsn = serde_json::from_str::<InstanceReport>(
        r#"{"pod":"p","role":"primary","ready":true,"currentLsn":"nonsense"}"#,
    );
    assert!(bad_lsn.is_err());
}

#[test]
fn a_report_older_than_the_bound_is_stale_and_one_without_an_age_is_current() {
    let served = |age: &str| {
        let body =
            format!(r#"{{"pod":"p","role":"primary","ready":true,"currentLsn":"0/3000148"{age}}}"#);
        serde_json::from_str::<Served>(&body)
            .expect("parses")
            .current()
    };
    let fresh = served(r#","observedAt":"2025-03-01T12:00:07.655Z","ageSeconds":0.25"#)
        .expect("a fresh report");
    assert_eq!(fresh.current_lsn, Some(Lsn(0x0300_0148)));
    assert!(served(r#","ageSeconds":10.0"#).is_ok(), "at the bound");
    assert!(
        matches!(served(r#","ageSeconds":10.001"#), Err(FetchError::Stale(_))),
        "beyond the bound"
    );
    assert!(served("").is_ok(), "an older instance manager says no age");
    assert!(matches!(
        served(r#","ageSeconds":-1"#),
        Err(FetchError::BadAnswer(_))
    ));
    assert_eq!(
        FetchError::Stale("old".to_owned()).unavailable(),
        Unavailable::Stale
    );
    assert_eq!(
        Unavailable::Stale.to_string(),
        "the instance manager's status is stale"
    );
}

/// Answers from a table; pods not in it are unreachable.
#[derive(Debug)]
struct Table(BTreeMap<String, InstanceReport>);

impl InstanceStatusSource for Table {
    fn fetch<'a>(
        &'a self,
        address: &'a InstanceAddress,
    ) -> BoxFuture<'a, Result<InstanceReport, FetchError>> {
        let found = self.0.get(&address.pod).cloned();
        Box::pin(async move { found.ok_or(FetchError::Unreachable("refused".to_owned())) })
    }
}

fn pod(name: &str, ip: Option<&str>, role: Option<&str>) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some(name.to_owned());
    pod.metadata.uid = Some(format!("uid-{name}"));
    if let Some(role) = role {
        pod.metadata.labels = Some(BTreeMap::from([(
            super::super::build::ROLE_LABEL.to_owned(),
            role.to_owned(),
        )]));
    }
    pod.status = Some(PodStatus {
        pod_ip: ip.map(str::to_owned),
        ..PodStatus::default()
    });
    pod
}

fn report(pod: &str, role: ReportedRole) -> InstanceReport {
    InstanceReport {
        pod: pod.to_owned(),
        role,
        ready: true,
        timeline: Some(1),
        current_lsn: None,
        received_lsn: None,
        replayed_lsn: None,
        streaming: false,
        pending_restart: Vec::new(),
        following: None,
        system_identifier: None,
        initialized_by: None,
        message: None,
        restart_by_switchover: false,
        settings_digest: None,
        wal_archive: None,
        in_place: None,
        manager_digest: None,
        certificate_authorities: None,
    }
}

#[tokio::test]
async fn every_pod_is_observed_in_order_with_a_stable_reason_when_it_has_no_report() {
    let source = Table(BTreeMap::from([
        ("db-0".to_owned(), report("db-0", ReportedRole::Primary)),
        // An address reused by another pod.
        ("db-2".to_owned(), report("db-9", ReportedRole::Replica)),
    ]));
    let pods = [
        pod("db-0", Some("10.0.0.1"), Some("primary")),
        pod("db-1", Some("10.0.0.2"), None),
        pod("db-2", Some("10.0.0.3"), None),
        pod("db-3", None, None),
    ];
    let observed = observe(&pods, &source, None).await;
    let summary: Vec<_> = observed
        .iter()
        .map(|o| {
            (
                o.pod.as_str(),
                o.role_label.as_deref(),
                o.report.clone().err(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("db-0", Some("primary"), None),
            ("db-1", None, Some(Unavailable::Unreachable)),
            ("db-2", None, Some(Unavailable::BadAnswer)),
            ("db-3", None, Some(Unavailable::NoAddress)),
        ]
    );
    assert!(observed[0].is_ready_primary());
    assert_eq!(observed[0].uid.as_deref(), Some("uid-db-0"));
}

/// A server on a free loopback port answering every connection with `response` (after
/// reading the request), or never answering when `response` is `None`.
async fn server(response: Option<String>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let response = response.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request).await;
                match response {
                    Some(response) => {
                        let _ = stream.write_all(response.as_bytes()).await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(60)).await,
                }
            });
        }
    });
    port
}

fn http(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

async fn ask(port: u16) -> Result<InstanceReport, FetchError> {
    let source = HttpInstanceStatus::new(port, Duration::from_millis(300));
    let address = InstanceAddress {
        pod: "db-0".to_owned(),
        ip: IpAddr::from([127, 0, 0, 1]),
        uid: None,
        access: None,
    };
    source.fetch(&address).await
}

#[tokio::test]
async fn the_http_source_reads_a_status_and_tells_failures_apart() {
    let body = r#"{"pod":"db-0","role":"primary","ready":true,"timeline":2,"currentLsn":"0/3000148","receivedLsn":null,"replayedLsn":null,"streaming":false,"pendingRestart":["shared_buffers"]}"#;
    let report = ask(server(Some(http("200 OK", body))).await)
        .await
        .expect("a report");
    assert_eq!(
        (report.role, report.timeline, report.current_lsn),
        (ReportedRole::Primary, Some(2), Some(Lsn(0x0300_0148)))
    );
    assert_eq!(report.pending_restart, ["shared_buffers"]);
    let unavailable = ask(server(Some(http("503 Service Unavailable", "{}"))).await).await;
    assert!(
        matches!(unavailable, Err(FetchError::BadAnswer(_))),
        "{unavailable:?}"
    );
    let old = r#"{"pod":"db-0","role":"primary","ready":true,"ageSeconds":30.5}"#;
    let stale = ask(server(Some(http("200 OK", old))).await).await;
    assert!(matches!(stale, Err(FetchError::Stale(_))), "{stale:?}");
    let garbage = ask(server(Some(http("200 OK", "<html>"))).await).await;
    assert!(
        matches!(garbage, Err(FetchError::BadAnswer(_))),
        "{garbage:?}"
    );
    let silent = ask(server(None).await).await;
    assert!(
        matches!(silent, Err(FetchError::Unreachable(_))),
        "{silent:?}"
    );
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        drop(listener);
        ask(port).await
    };
    assert!(
        matches!(closed, Err(FetchError::Unreachable(_))),
        "{closed:?}"
    );
}
