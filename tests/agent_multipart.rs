//! The agent's multipart upload against the test bed's S3 server, through the `pgkube` library:
//! the SDK lets go of every part once its upload returns, so streams of many parts, one after
//! the other, go through the same `parts_in_flight + 1` buffers, and each object stored is its
//! stream. The last two streams are exact multiples of the part size, so they end with an
//! empty read, whose buffer must go back to the pool too. Parts that grow as the upload goes on
//! (every 900 parts in a real backup, every 2 here) are stored as one object like any other.

use pgkube::agent::multipart::{MIN_PART_SIZE, MultipartUpload, PartBuffers};
use pgkube::agent::part_size::PartSizes;
use pgkube::agent::storage::Store;
use pgkube_controllers::storage::keys::BackupKeys;
use pgkube_testkit::{TestBucket, testbed};
use sha2::{Digest, Sha256};

const MIB: usize = 1024 * 1024;

fn keys(backup: &str) -> BackupKeys {
    BackupKeys::new("", "cluster-uid", backup, "backup-uid").expect("keys")
}

#[tokio::test]
async fn streams_of_many_parts_reuse_the_same_few_buffers() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "multipart").await;
    let store = Store::with_client(bucket.client(), bucket.name(), keys("pool"));
    let parts_in_flight = 2;
    let mut buffers = PartBuffers::new(MIN_PART_SIZE, parts_in_flight);

    for (name, length, parts) in [
        ("tail", 8 * MIN_PART_SIZE + MIB / 3, 9),
        ("exact", 4 * MIN_PART_SIZE, 4),
        ("exact-again", 4 * MIN_PART_SIZE, 4),
    ] {
        let stream: Vec<u8> = (0..length)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let key = store.keys.database(name);
        let upload = MultipartUpload::create(&store, &key, parts_in_flight)
            .await
            .expect("create");
        let sent = upload
            .send(&mut stream.as_slice(), &mut buffers)
            .await
            .expect("send");
        assert_eq!(sent.part_count(), parts, "{name}");
        let (size, sha256) = upload.complete(sent).await.expect("complete");

        assert_eq!(size, stream.len() as u64, "{name}");
        assert_eq!(sha256, hex::encode(Sha256::digest(&stream)), "{name}");
        assert_eq!(buffers.allocated(), parts_in_flight + 1, "{name}");
        let stored = bucket.object(&key).await.expect("the stored object");
        assert!(
            stored == stream.as_slice(),
            "{name}: the stored object is the stream"
        );
    }
    bucket.cleanup().await;
}

#[tokio::test]
async fn parts_that_grow_with_the_part_count_make_one_object() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "multipart-growth").await;
    let store = Store::with_client(bucket.client(), bucket.name(), keys("growth"));
    let parts_in_flight = 2;
    let sizes = PartSizes::new(MIN_PART_SIZE).doubling_every(2);
    let mut buffers = PartBuffers::with_sizes(sizes, parts_in_flight);
    // 5 + 5 + 10 + 10 + 20 MiB, then a short last part.
    let expected_parts = [5 * MIB, 5 * MIB, 10 * MIB, 10 * MIB, 20 * MIB, MIB / 3];
    let stream: Vec<u8> = (0..expected_parts.iter().sum::<usize>())
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let key = store.keys.database("growing");

    let upload = MultipartUpload::create(&store, &key, parts_in_flight)
        .await
        .expect("create");
    let sent = upload
        .send(&mut stream.as_slice(), &mut buffers)
        .await
        .expect("send");
    assert_eq!(sent.part_count(), expected_parts.len());
    let (size, sha256) = upload.complete(sent).await.expect("complete");
    assert_eq!(size, stream.len() as u64);
    assert_eq!(sha256, hex::encode(Sha256::digest(&stream)));
    // Each size needed its own buffers, at most parts in flight + 1 of them.
    assert!(
        buffers.allocated() <= 4 * (parts_in_flight + 1),
        "{}",
        buffers.allocated()
    );

    let s3 = bucket.client();
    for (index, expected) in expected_parts.iter().enumerate() {
        let part = s3
            .head_object()
            .bucket(bucket.name())
            .key(&key)
            .part_number(i32::try_from(index + 1).expect("part number"))
            .send()
            .await
            .expect("HeadObject of a part");
        assert_eq!(
            part.content_length(),
            Some(*expected as i64),
            "part {}",
            index + 1
        );
    }
    let stored = bucket.object(&key).await.expect("the stored object");
    assert!(
        stored == stream.as_slice(),
        "the stored object is the stream"
    );
    bucket.cleanup().await;
}
