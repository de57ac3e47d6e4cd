//! `deliver --kind`: a broker destination on the machine's own servers, and counting what
//! arrived there (Redis `XLEN`, the JetStream stream's messages, the AMQP queue's depth).

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::{Value, json};

/// Where one run's messages go, and how they are counted.
pub enum Broker {
    Redis { conn: redis::aio::MultiplexedConnection, stream: String },
    Nats { js: async_nats::jetstream::Context, name: String },
    Amqp { _conn: lapin::Connection, channel: lapin::Channel, queue: String },
}

impl Broker {
    /// The broker for `kind`, with a fresh stream, JetStream stream or queue; `None` for http.
    pub async fn open(kind: &str) -> anyhow::Result<Option<Broker>> {
        let name = format!("herald_bench_{}", std::process::id());
        Ok(Some(match kind {
            "http" => return Ok(None),
            "redis-stream" => {
                let mut conn =
                    redis::Client::open("redis://127.0.0.1:6379")?.get_multiplexed_async_connection().await?;
                let _: () = redis::cmd("DEL").arg(&name).query_async(&mut conn).await?;
                Broker::Redis { conn, stream: name }
            }
            "nats" => {
                let js = async_nats::jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
                let _ = js.delete_stream(&name).await;
                let subjects = vec![format!("{name}.>")];
                js.create_stream(async_nats::jetstream::stream::Config {
                    name: name.clone(),
                    subjects,
                    ..Default::default()
                })
                .await?;
                Broker::Nats { js, name }
            }
            "amqp" => {
                use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
                use lapin::types::FieldTable;
                let conn =
                    lapin::Connection::connect("amqp://127.0.0.1:5672/%2f", lapin::ConnectionProperties::default())
                        .await?;
                let channel = conn.create_channel().await?;
                let _ = channel.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await;
                channel
                    .queue_declare(name.as_str().into(), QueueDeclareOptions::default(), FieldTable::default())
                    .await?;
                Broker::Amqp { _conn: conn, channel, queue: name }
            }
            other => bail!("unknown kind {other:?} (http, redis-stream, nats, amqp)"),
        }))
    }

    /// Points an endpoint spec at this broker.
    pub fn target(&self, spec: &mut Value) {
        let (kind, url, destination) = match self {
            Broker::Redis { stream, .. } => ("redis-stream", "redis://127.0.0.1:6379", json!({"stream": stream})),
            Broker::Nats { name, .. } => {
                ("nats", "nats://127.0.0.1:4222", json!({"subject": format!("{name}.{{type}}")}))
            }
            // The default exchange routes by the queue's name.
            Broker::Amqp { queue, .. } => {
                ("amqp", "amqp://127.0.0.1:5672/%2f", json!({"exchange": "", "routing_key": queue}))
            }
        };
        spec["kind"] = json!(kind);
        spec["url"] = json!(url);
        spec["destination"] = destination;
    }

    /// Waits until `total` messages are there.
    pub async fn wait_for(&self, total: usize, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let n = self.count().await?;
            if n >= total {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{n} of {total} messages within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn count(&self) -> anyhow::Result<usize> {
        Ok(match self {
            Broker::Redis { conn, stream } => redis::cmd("XLEN").arg(stream).query_async(&mut conn.clone()).await?,
            Broker::Nats { js, name } => js.get_stream(name).await?.info().await?.state.messages as usize,
            Broker::Amqp { channel, queue, .. } => {
                let passive = lapin::options::QueueDeclareOptions { passive: true, ..Default::default() };
                let q = channel.queue_declare(queue.as_str().into(), passive, Default::default()).await?;
                q.message_count() as usize
            }
        })
    }

    /// Removes what the run left on the broker.
    pub async fn clean(self) -> anyhow::Result<()> {
        match self {
            Broker::Redis { mut conn, stream } => redis::cmd("DEL").arg(&stream).query_async::<()>(&mut conn).await?,
            Broker::Nats { js, name } => {
                js.delete_stream(&name).await?;
            }
            Broker::Amqp { channel, queue, .. } => {
                channel.queue_delete(queue.as_str().into(), Default::default()).await?;
            }
        }
        Ok(())
    }
}
