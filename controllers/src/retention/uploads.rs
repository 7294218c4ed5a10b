//! Which open multipart uploads a retention pass aborts (pure): those under the cluster's root
//! that a killed agent left behind, older than [`STALE_UPLOAD_AGE`].

use chrono::{DateTime, TimeDelta, Utc};

/// Age from which an unfinished multipart upload counts as left behind (by a killed agent).
pub const STALE_UPLOAD_AGE: TimeDelta = TimeDelta::hours(24);

/// A multipart upload that was started and neither completed nor aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenUpload {
    pub key: String,
    pub upload_id: String,
    /// When it was started; `None` when the store did not say (such an upload is left alone).
    pub initiated: Option<DateTime<Utc>>,
}

/// The uploads under `root` started more than [`STALE_UPLOAD_AGE`] before `now`.
pub fn stale_uploads(root: &str, uploads: &[OpenUpload], now: DateTime<Utc>) -> Vec<OpenUpload> {
    uploads
        .iter()
        .filter(|upload| upload.key.starts_with(root))
        .filter(|upload| {
            upload
                .initiated
                .is_some_and(|initiated| now - initiated > STALE_UPLOAD_AGE)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn upload(key: &str, hours_ago: Option<i64>) -> OpenUpload {
        let now = Utc.with_ymd_and_hms(2025, 6, 30, 12, 0, 0).single();
        OpenUpload {
            key: key.into(),
            upload_id: format!("id-{key}"),
            initiated: hours_ago.and_then(|hours| Some(now? - TimeDelta::hours(hours))),
        }
    }

    #[test]
    fn uploads_under_the_clusters_root_older_than_a_day_are_aborted() {
        let now = Utc
            .with_ymd_and_hms(2025, 6, 30, 12, 0, 0)
            .single()
            .expect("a time");
        let uploads = [
            upload("ns/a/c1/b1/u1/databases/app.dump", Some(25)),
            upload("ns/a/c1/b2/u2/databases/app.dump", Some(23)),
            upload("ns/a/c1/b3/u3/databases/app.dump", Some(24)),
            upload("ns/a/c1/b4/u4/databases/app.dump", None),
            upload("ns/a/c2/b1/u1/databases/app.dump", Some(48)),
            upload("ns/a/b1/databases/app.dump", Some(48)),
        ];
        assert_eq!(
            stale_uploads("ns/a/c1/", &uploads, now),
            [uploads[0].clone()]
        );
    }
}
