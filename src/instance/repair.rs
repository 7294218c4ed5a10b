//! A replica that does not stream from the primary it follows: why ([`stream::diagnose`]),
//! and bringing it back (pg_rewind, or a new clone).
//!
//! Each tick counts the periods a replica has gone without streaming ([`stream::Stall`]); after
//! [`stream::PATIENCE`] of them it asks its primary, as the superuser, for its timeline, the
//! timeline's history and the oldest WAL it keeps, and compares with its own position. A
//! primary that does not answer, or answers as a standby (a switchover not done yet), says
//! nothing: the replica waits. When it is stuck, the server stops (fast), and the data is
//! rewound to the primary's history or cloned afresh, slot first, as when a former primary
//! rejoins ([`super::roles`]); then it starts again as the primary's standby.

use anyhow::Context as _;

use super::control::Target;
use super::datadir::{self, Role};
use super::endpoint::InstanceStatus;
use super::server::{Server, Shutdown};
use super::sql;
use super::stream::{self, Lsn, PrimaryView, Remedy, ReplicaView, Stuck};
use super::{Instance, Signals};

/// How long a standby about to start waits for its primary's history.
const PRIMARY_LOOK: std::time::Duration = std::time::Duration::from_secs(30);

impl Instance {
    /// After a tick's observation (whether the server is `in_recovery` and `streaming`): why
    /// this replica cannot stream, when it has not for a while and its primary tells.
    pub(super) async fn stuck(
        &mut self,
        client: &tokio_postgres::Client,
        in_recovery: bool,
        streaming: bool,
    ) -> Option<Stuck> {
        if self.role != Role::Replica || !in_recovery {
            self.stall.reset();
            return None;
        }
        let target = self.upstream.clone()?;
        if !self.stall.observe(streaming) {
            return None;
        }
        let replica = match replica_view(client).await {
            Ok(view) => view?,
            Err(error) => {
                tracing::debug!(%error, "cannot read this standby's position");
                return None;
            }
        };
        let primary = self.primary_view(&target).await?;
        let stuck = stream::diagnose(&replica, &primary);
        if stuck.is_none() {
            tracing::info!(
                primary = %target.pod,
                timeline = replica.timeline,
                replayed = %replica.replayed,
                primary_timeline = primary.timeline,
                "not streaming from the primary, for no lasting reason found; waiting"
            );
        }
        stuck
    }

    /// What `target` tells of its WAL, if it answers as a primary.
    async fn primary_view(&self, target: &Target) -> Option<PrimaryView> {
        let client = self.connect_as_superuser(target).await?;
        let wal = sql::primary_wal(&client)
            .await
            .inspect_err(|error| tracing::warn!(%error, primary = %target.pod, "cannot read the primary's WAL state"))
            .ok()??;
        let segment_size = u64::try_from(wal.segment_size).ok()?;
        Some(PrimaryView {
            timeline: u32::try_from(wal.timeline).ok()?,
            history: stream::parse_history(wal.history.as_deref().unwrap_or_default()),
            oldest_segment: wal
                .oldest_segment
                .and_then(|name| stream::segment_of_file(&name, segment_size)),
            segment_size,
        })
    }

    /// Stops the server, rewinds or clones its data as `stuck` calls for, and starts it again
    /// as the standby of the same primary. None when a signal asked to stop meanwhile.
    pub(super) async fn repair(
        &mut self,
        server: Server,
        stuck: Stuck,
        signals: &mut Signals,
    ) -> anyhow::Result<Option<Server>> {
        let target = self.upstream.clone().context("no primary to rejoin")?;
        tracing::warn!(primary = %target.pod, reason = %stuck, remedy = ?stuck.remedy(), "this replica cannot stream from its primary; it stops and is brought back");
        self.set_status(InstanceStatus::starting(&self.args.pod_name));
        let shutdown = self.stop_server(server, self.args.shutdown_timeout).await;
        if shutdown != Shutdown::Clean {
            // pg_rewind recovers such a target itself first.
            tracing::warn!(?shutdown, "the standby did not stop cleanly");
        }
        tokio::select! {
            rebuilt = self.rebuild(&target, stuck.remedy()) => rebuilt?,
            request = signals.stop_requested() => {
                tracing::info!(?request, "stopping while rejoining");
                return Ok(None);
            }
        }
        Ok(Some(self.start_server().await?))
    }

    /// Before a standby starts on its data: when it already went past where its primary's
    /// timeline forked off (it was ahead of the instance a failover promoted), PostgreSQL would
    /// refuse to start it; it is rewound to the primary's history first. A primary that does
    /// not answer as one says nothing: the standby starts as it is.
    pub(super) async fn rewind_if_diverged(&mut self) -> anyhow::Result<()> {
        let Some(target) = self.upstream.clone() else {
            return Ok(());
        };
        let controldata = datadir::controldata(&self.args.pgdata).await?;
        let Some(local) = stream::stopped_view(&controldata) else {
            return Ok(());
        };
        let look = tokio::time::timeout(PRIMARY_LOOK, self.primary_view(&target));
        let Ok(Some(primary)) = look.await else {
            return Ok(());
        };
        let Some(stuck) = stream::diverged(&local, &primary) else {
            return Ok(());
        };
        tracing::warn!(primary = %target.pod, reason = %stuck, "this standby cannot start on its data as the primary's standby; it is rewound first");
        self.rebuild(&target, Remedy::Rewind).await
    }

    async fn rebuild(&mut self, target: &Target, remedy: Remedy) -> anyhow::Result<()> {
        match remedy {
            Remedy::Rewind => {
                let target = self.rewind_to(target).await?;
                self.upstream = Some(target);
                Ok(())
            }
            Remedy::Reclone => {
                tracing::warn!(primary = %target.pod, "this replica is cloned afresh from its primary");
                self.replace_with_clone(target.clone()).await
            }
        }
    }
}

/// The local standby's timeline and positions; none before it replayed anything.
async fn replica_view(
    client: &tokio_postgres::Client,
) -> Result<Option<ReplicaView>, tokio_postgres::Error> {
    let (timeline, replayed, received) = sql::standby_position(client).await?;
    let Some(replayed) = replayed.as_deref().and_then(Lsn::parse) else {
        return Ok(None);
    };
    let Ok(timeline) = u32::try_from(timeline) else {
        return Ok(None);
    };
    let needed = received.as_deref().and_then(Lsn::parse).unwrap_or(replayed);
    Ok(Some(ReplicaView {
        timeline,
        replayed,
        needed,
    }))
}
