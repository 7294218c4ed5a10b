//! A fresh S3 bucket per test.

use anyhow::Context as _;
use aws_sdk_s3::types::{Delete, ObjectIdentifier};

use crate::TestEnv;
use crate::names::unique_name;

/// A bucket with a unique name, emptied and deleted by [`TestBucket::cleanup`] or on drop.
///
/// The test bed's key may create buckets, so each test gets a whole bucket rather than a prefix
/// of a shared one: listing "everything" in a test then really means that test's objects.
pub struct TestBucket {
    env: TestEnv,
    name: String,
    cleaned_up: bool,
}

impl TestBucket {
    pub async fn create(env: &TestEnv, prefix: &str) -> TestBucket {
        let name = unique_name(prefix);
        env.s3_client()
            .create_bucket()
            .bucket(&name)
            .send()
            .await
            .unwrap_or_else(|e| panic!("creating test bucket {name}: {e:?}"));
        TestBucket {
            env: env.clone(),
            name,
            cleaned_up: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn client(&self) -> aws_sdk_s3::Client {
        self.env.s3_client()
    }

    /// The whole content of object `key`.
    pub async fn object(&self, key: &str) -> anyhow::Result<Vec<u8>> {
        let object = self
            .client()
            .get_object()
            .bucket(&self.name)
            .key(key)
            .send()
            .await?;
        Ok(object.body.collect().await?.into_bytes().to_vec())
    }

    pub async fn cleanup(mut self) {
        self.cleaned_up = true;
        if let Err(error) = delete_bucket(&self.env.s3_client(), &self.name).await {
            eprintln!("warning: deleting test bucket {}: {error:#}", self.name);
        }
    }
}

impl Drop for TestBucket {
    /// Best effort: a runtime (and client) of its own on a thread of its own.
    fn drop(&mut self) {
        if self.cleaned_up {
            return;
        }
        let (env, name) = (self.env.clone(), self.name.clone());
        let outcome = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(delete_bucket(&env.s3_client(), &name))
        })
        .join();
        if let Ok(Err(error)) = outcome {
            eprintln!("warning: deleting test bucket {}: {error:#}", self.name);
        }
    }
}

/// Deletes every object (a page of up to 1000 keys per DeleteObjects call), then the bucket.
async fn delete_bucket(client: &aws_sdk_s3::Client, bucket: &str) -> anyhow::Result<()> {
    loop {
        let page = client
            .list_objects_v2()
            .bucket(bucket)
            .send()
            .await
            .context("listing objects")?;
        let keys: Vec<ObjectIdentifier> = page
            .contents()
            .iter()
            .filter_map(|object| object.key())
            .map(|key| ObjectIdentifier::builder().key(key).build())
            .collect::<Result<_, _>>()?;
        if keys.is_empty() {
            break;
        }
        let delete = Delete::builder().set_objects(Some(keys)).build()?;
        client
            .delete_objects()
            .bucket(bucket)
            .delete(delete)
            .send()
            .await
            .context("deleting objects")?;
    }
    client
        .delete_bucket()
        .bucket(bucket)
        .send()
        .await
        .context("deleting bucket")?;
    Ok(())
}
