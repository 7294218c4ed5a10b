//! The agent's multipart upload against the test bed's S3 server, through the `pgkube` library:
//! the SDK lets go of every part once its upload returns, so streams of many parts, one after
//! the other, go through the same `parts_in_flight + 1` buffers, and each object stored is its
//! stream. The last two streams are exact multiples of the part size, so they end with an
//! empty read, whose buffer must go back to the pool too.

use pgkube::agent::multipart::{MIN_PART_SIZE, MultipartUpload, PartBuffers};
use pgkube::agent::storage::Store;
use pgkube_testkit::{TestBucket, testbed};
use sha2::{Digest, Sha256};

const MIB: usize = 1024 * 1024;

#[tokio::test]
async fn streams_of_many_parts_reuse_the_same_few_buffers() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "multipart").await;
    let store = Store::with_client(bucket.client(), bucket.name(), "pool");
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
        let key = store.database_key(name);
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
        let stored = bucket
            .client()
            .get_object()
            .bucket(bucket.name())
            .key(&key)
            .send()
            .await
            .expect("get")
            .body
            .collect()
            .await
            .expect("body")
            .into_bytes();
        assert!(
            stored == stream.as_slice(),
            "{name}: the stored object is the stream"
        );
    }
    bucket.cleanup().await;
}
