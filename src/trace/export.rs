//! Finished spans leave through a bounded queue and one export task, so a call
//! never waits on the collector: [`Queue::on_end`] (called as a span ends, on the
//! request's thread) only tries to enqueue, and a full queue drops the span and
//! counts it. The task sends a batch when it is full or when the oldest span has
//! waited the schedule delay; an export that fails (collector down, slow past its
//! timeout, or refusing) loses its batch, counted, and warns at most once a
//! minute.
//!
//! Why not the SDK's `BatchSpanProcessor`: it also drops when full, but counts
//! nothing a scrape can read, and runs its own thread; this queue feeds the same
//! OTLP exporter from a task of the runtime the server already has.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use prometheus::IntCounter;
use tokio::sync::{mpsc, oneshot};

/// What became of finished spans (`sluice_trace_spans_total{result}`).
#[derive(Debug, Clone)]
pub struct Counters {
    pub exported: IntCounter,
    /// Dropped because the queue was full.
    pub dropped: IntCounter,
    /// Lost with a batch the collector did not take.
    pub failed: IntCounter,
}

/// The span processor of the tracer: enqueues finished spans for `run`.
#[derive(Debug)]
pub struct Queue {
    tx: mpsc::Sender<Message>,
    dropped: IntCounter,
}

enum Message {
    Span(Box<SpanData>),
    /// Send what is queued, then stop.
    Flush(oneshot::Sender<()>),
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Message::Span(_) => "Span",
            Message::Flush(_) => "Flush",
        })
    }
}

/// Stops the export task after a last flush.
#[derive(Debug)]
pub struct Stopper {
    tx: mpsc::Sender<Message>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Stopper {
    /// Sends the spans still queued, waiting at most `grace`.
    pub async fn stop(&self, grace: Duration) {
        let (done, wait) = oneshot::channel();
        // A full queue still takes the flush: it waits for room, within the grace.
        let flush = async {
            if self.tx.send(Message::Flush(done)).await.is_ok() {
                let _ = wait.await;
            }
        };
        let _ = tokio::time::timeout(grace, flush).await;
        if let Some(task) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
    }
}

/// A queue of `size` spans, and its export task on the current runtime sending
/// batches of at most `batch` to `exporter`.
pub fn start<E: SpanExporter + 'static>(
    exporter: E,
    size: usize,
    batch: usize,
    delay: Duration,
    counters: Counters,
) -> (Queue, Stopper) {
    let (tx, rx) = mpsc::channel(size);
    let queue = Queue {
        tx: tx.clone(),
        dropped: counters.dropped.clone(),
    };
    let task = tokio::spawn(run(exporter, rx, batch, delay, counters));
    let stopper = Stopper {
        tx,
        task: Mutex::new(Some(task)),
    };
    (queue, stopper)
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.tx.try_send(Message::Span(Box::new(span))).is_err() {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        // The server stops the export task itself ([`Stopper::stop`]), awaiting it
        // rather than blocking a runtime thread here.
        Ok(())
    }
}

async fn run<E: SpanExporter>(
    exporter: E,
    mut rx: mpsc::Receiver<Message>,
    batch: usize,
    delay: Duration,
    counters: Counters,
) {
    // Grown as spans come: a batch seldom fills, and each one sent leaves it empty.
    let mut spans: Vec<SpanData> = Vec::new();
    let mut warned: Option<Instant> = None;
    loop {
        // Wait for the first span of a batch, then at most `delay` for the rest.
        let first = match rx.recv().await {
            None => break,
            Some(m) => m,
        };
        let mut flush = None;
        match first {
            Message::Span(s) => spans.push(*s),
            Message::Flush(done) => flush = Some(done),
        }
        let deadline = tokio::time::Instant::now() + delay;
        while flush.is_none() && spans.len() < batch {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Message::Span(s))) => spans.push(*s),
                Ok(Some(Message::Flush(done))) => flush = Some(done),
                Ok(None) | Err(_) => break,
            }
        }
        send(&exporter, &mut spans, &counters, &mut warned).await;
        if let Some(done) = flush {
            // Whatever arrived before the flush request was sent with the batch;
            // drain the rest that is already queued.
            while let Ok(Message::Span(s)) = rx.try_recv() {
                spans.push(*s);
                if spans.len() >= batch {
                    send(&exporter, &mut spans, &counters, &mut warned).await;
                }
            }
            send(&exporter, &mut spans, &counters, &mut warned).await;
            let _ = done.send(());
            break;
        }
    }
}

/// Exports `spans` (emptying it) and counts how that went.
async fn send<E: SpanExporter>(
    exporter: &E,
    spans: &mut Vec<SpanData>,
    counters: &Counters,
    warned: &mut Option<Instant>,
) {
    if spans.is_empty() {
        return;
    }
    let n = spans.len() as u64;
    match exporter.export(std::mem::take(spans)).await {
        Ok(()) => counters.exported.inc_by(n),
        Err(e) => {
            counters.failed.inc_by(n);
            if warned.is_none_or(|w| w.elapsed() >= Duration::from_secs(60)) {
                *warned = Some(Instant::now());
                tracing::warn!(error = %e, spans = n, "trace export failed; spans lost (sluice_trace_spans_total{{result=\"failed\"}})");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// An exporter that takes `ok` batches, then fails; or blocks forever.
    #[derive(Debug, Clone)]
    struct Collector {
        got: Arc<AtomicUsize>,
        up: bool,
        hang: bool,
    }

    impl SpanExporter for Collector {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            if self.hang {
                std::future::pending::<()>().await;
            }
            if !self.up {
                return Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                    "connection refused".into(),
                ));
            }
            self.got.fetch_add(batch.len(), Ordering::SeqCst);
            Ok(())
        }
    }

    fn counters() -> Counters {
        Counters {
            exported: IntCounter::new("e", "e").unwrap(),
            dropped: IntCounter::new("d", "d").unwrap(),
            failed: IntCounter::new("f", "f").unwrap(),
        }
    }

    fn spans(provider: &SdkTracerProvider, n: usize) {
        let tracer = provider.tracer("test");
        for _ in 0..n {
            tracer.start("call").end();
        }
    }

    #[tokio::test]
    async fn spans_are_exported_in_batches_and_flushed_at_stop() {
        let got = Arc::new(AtomicUsize::new(0));
        let c = counters();
        let exporter = Collector {
            got: got.clone(),
            up: true,
            hang: false,
        };
        let (queue, stopper) = start(exporter, 100, 10, Duration::from_secs(3600), c.clone());
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .build();
        spans(&provider, 25);
        stopper.stop(Duration::from_secs(10)).await;
        assert_eq!(got.load(Ordering::SeqCst), 25);
        assert_eq!(c.exported.get(), 25);
        assert_eq!((c.dropped.get(), c.failed.get()), (0, 0));
    }

    #[tokio::test]
    async fn a_collector_that_is_down_loses_spans_counted() {
        let c = counters();
        let exporter = Collector {
            got: Arc::default(),
            up: false,
            hang: false,
        };
        let (queue, stopper) = start(exporter, 100, 10, Duration::from_millis(1), c.clone());
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .build();
        spans(&provider, 5);
        stopper.stop(Duration::from_secs(10)).await;
        assert_eq!((c.exported.get(), c.failed.get()), (0, 5));
    }

    #[tokio::test]
    async fn a_hung_collector_never_blocks_ending_a_span() {
        let c = counters();
        let exporter = Collector {
            got: Arc::default(),
            up: true,
            hang: true,
        };
        let (queue, stopper) = start(exporter, 8, 4, Duration::from_millis(1), c.clone());
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .build();
        let started = Instant::now();
        // The task takes one batch and hangs on it; the queue fills; the rest drop.
        for _ in 0..10 {
            spans(&provider, 100);
            tokio::task::yield_now().await;
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            c.dropped.get() >= 1000 - 8 - 4,
            "dropped {}",
            c.dropped.get()
        );
        stopper.stop(Duration::from_millis(50)).await;
    }
}
