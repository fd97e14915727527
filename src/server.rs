//! `sluice serve`: wires the sources, the store, the limiter and both servers, and
//! shuts them down together.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::clock::SystemClock;
use crate::config::{AdminAddr, Serve, DEFAULT_ADMIN_ADDR};
use crate::guard::Guard;
use crate::hash::ValueHash;
use crate::http::{metrics_router, router, HttpState};
use crate::limiter::key::Hashing;
use crate::limiter::{Limiter, Settings};
use crate::serve_http;
use crate::service::grpc::Grpc;
use crate::service::rlqs::{Quotas, Settings as QuotaSettings};
use crate::service::Service;
use crate::source::replicas::{ReplicaWatch, ServiceRef};
use crate::store::redis::Options as RedisOptions;
use crate::store::{Demand, MemoryDemand, MemoryStore, RedisStore, Report, Store};
use crate::telemetry::Metrics;
use crate::tls::{Tls, TlsFiles, TlsListener};
use crate::trace::Tracer;

/// Runs the service until `shutdown` resolves, then drains in-flight calls.
/// How values are hashed in counter keys: under the operator's secret when one is
/// given. `--hash-keys` promises values that cannot be recovered, so it needs one.
/// Without a secret, long values are hashed under a key of this process for the
/// memory store, or under a public key for Redis, where every replica must agree.
fn hashing(cfg: &Serve, shared: bool) -> anyhow::Result<Hashing> {
    let secret = match (&cfg.decisions.hash_secret_file, &cfg.decisions.hash_secret) {
        (Some(path), _) => {
            let bytes = std::fs::read(path)
                .with_context(|| format!("--hash-secret-file {}", path.display()))?;
            Some(bytes.trim_ascii_end().to_vec())
        }
        (None, Some(secret)) => Some(secret.0.as_bytes().to_vec()),
        (None, None) => None,
    };
    let hash = match secret {
        Some(secret) => {
            ValueHash::from_secret(&secret).context("--hash-secret-file or SLUICE_HASH_SECRET")?
        }
        None if cfg.decisions.hash_keys => bail!(
            "--hash-keys needs a secret: --hash-secret-file PATH or SLUICE_HASH_SECRET, the same \
             on every replica (without one, anyone who reads the counter keys could recover \
             client addresses from their hashes)"
        ),
        None if shared => {
            tracing::warn!(
                "no hash secret: values over 64 bytes are hashed in Redis keys under a public \
                 key; set --hash-secret-file so that they cannot be aimed at other counters"
            );
            ValueHash::public()
        }
        None => ValueHash::random(),
    };
    Ok(Hashing {
        all: cfg.decisions.hash_keys,
        hash,
    })
}

pub async fn run(
    cfg: Serve,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if cfg.policies.config.is_empty() && !cfg.policies.kube && cfg.xds.xds_server.is_none() {
        bail!(
            "no policies to serve: pass --config FILE (a policy file or a directory of *.yaml), \
             --kube to watch RateLimitPolicy resources, or --xds-server URL to take them over xDS"
        );
    }
    let (buffered, largest) = (
        cfg.connections.grpc_max_buffered_request_bytes,
        cfg.connections.max_request_bytes,
    );
    if buffered < largest {
        // Else one legitimate message in several frames could never be read whole.
        bail!(
            "--grpc-max-buffered-request-bytes {buffered} is below --max-request-bytes \
             {largest}: it must hold at least one whole request"
        );
    }
    if let Some(clash) = same_port(&cfg) {
        bail!("{clash}");
    }
    raise_open_file_limit();
    let shared = !cfg.store.redis.is_empty()
        || !cfg.store.redis_cluster.is_empty()
        || !cfg.store.redis_sentinel.is_empty();
    let hashing = hashing(&cfg, shared)?;
    let mut metrics = Metrics::new()
        .with_near_limit_ratio(cfg.metrics.near_limit_ratio)
        .with_peak_window(cfg.metrics.peak_window);
    if cfg.metrics.prometheus_addr.is_some() {
        metrics = metrics.with_erl(cfg.metrics.near_limit_ratio);
    }
    let metrics = Arc::new(metrics);
    let settings = Settings {
        failure_mode: cfg.decisions.failure_mode,
        store_timeout: cfg.store.store_timeout,
        hashing,
        denied_spend: cfg.decisions.denied_requests_spend,
        override_counter: cfg.decisions.override_counter,
        resets: cfg.reset_resolution(),
        store_errors: cfg.decisions.store_error_answer,
        local_replicas: cfg.decisions.local_share_replicas,
        max_keys: cfg.store.max_keys,
    };
    // Installed first: a SIGHUP while the policies load must not end the process.
    let rereads = hangups();
    // The stop signal exists before the sources start, so they stop with the rest.
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let sources = crate::source::start(&cfg, metrics.clone(), &stopped, &rereads).await?;
    let (policy, loaded, hub) = (sources.policy, sources.loaded, sources.hub);

    let cluster = !cfg.store.redis_cluster.is_empty();
    let sentinel = !cfg.store.redis_sentinel.is_empty();
    if cluster || sentinel || !cfg.store.redis.is_empty() {
        let (urls, flag) = if cluster {
            (cfg.store.redis_cluster.clone(), "--redis-cluster")
        } else if sentinel {
            (
                cfg.store.redis_sentinel_master.clone(),
                "--redis-sentinel-master / --redis-sentinel",
            )
        } else {
            (cfg.store.redis.clone(), "--redis")
        };
        let mut opts = RedisOptions::new(urls, cluster);
        opts.sentinels = cfg.store.redis_sentinel.clone();
        opts.call_timeout = cfg.store.store_timeout;
        opts.prefix = cfg.store.redis_key_prefix.clone();
        let store = RedisStore::new(opts, Some(metrics.clone())).context(flag)?;
        tracing::info!(shards = ?store.shard_names(), cluster, sentinel, "counters in redis");
        let limiter = Limiter::new(policy, store, settings);
        let demand: Arc<dyn Demand> = Arc::new(limiter.store().clone());
        let service = Arc::new(
            Service::new(limiter, cfg.header_style(), metrics)
                .echoing_request(cfg.decisions.response_dynamic_metadata),
        );
        sync_sentences(service.clone(), stopped());
        let beating = local_share(service.clone(), stopped(), stopped());
        // A peer's probe takes up to the store timeout; the rest is the network.
        let ask_wait = cfg.store.store_timeout + std::time::Duration::from_millis(50);
        crate::peers::ask(service.clone(), ask_wait, stopped());
        if let Some(name) = &cfg.decisions.local_share_service {
            replicas_from_service(service.clone(), name.clone(), stopped());
        }
        let served = serve(
            service.clone(),
            demand,
            &cfg,
            loaded,
            hub,
            stop_tx,
            stopped,
            rereads,
            shutdown,
        )
        .await;
        leave(&service, beating).await;
        return served;
    }

    if let Some(name) = &cfg.decisions.local_share_service {
        tracing::warn!(service = %name, "--local-share-service is ignored: counters are in memory, so no replica shares a limit");
    }
    let store = Arc::new(MemoryStore::new(Arc::new(SystemClock), cfg.store.max_keys));
    // The memory store cannot fail, but its (zero) error series keeps dashboards whole.
    metrics.shard_declared("memory", "local");
    let limiter = Limiter::new(policy, store.clone(), settings);
    let service = Arc::new(
        Service::new(limiter, cfg.header_style(), metrics.clone())
            .echoing_request(cfg.decisions.response_dynamic_metadata),
    );
    {
        let store = store.clone();
        every_second(stopped(), move || {
            store.sweep();
            // New keys refused at --max-keys are logged within a second, scraped
            // or not.
            let refused = store.evictions().refused;
            metrics.watch_refusals(store.name(), || store.active_keys(), refused);
            async {}
        });
    }

    serve(
        service,
        local_demand(),
        &cfg,
        loaded,
        hub,
        stop_tx,
        stopped,
        rereads,
        shutdown,
    )
    .await
}

/// RLQS demand shared among this process's streams.
fn local_demand() -> Arc<dyn Demand> {
    Arc::new(MemoryDemand::new(Arc::new(SystemClock)))
}

/// Every second, brings in the penalty sentences a shared store holds (other
/// replicas' bans and blocks, operators' blocks and unblocks), so this replica
/// denies them without a store call.
fn sync_sentences<S: Store>(
    service: Arc<Service<S>>,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    every_second(stop, move || {
        let service = service.clone();
        async move {
            if let Err(e) = service.limiter.sync_sentences().await {
                tracing::debug!(error = %e, "reading the shared block list failed");
            }
        }
    });
}

/// `failure_mode: local`: every second, counts this replica as serving and learns
/// how many are (while some domain is local); every 100 ms, moves the local
/// share's clock on and adds local spending to the store once it answers. Answers
/// the heartbeat's task, which ends at `stop_beat`.
fn local_share<S: Store>(
    service: Arc<Service<S>>,
    stop: impl Future<Output = ()> + Send + 'static,
    stop_beat: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    {
        let service = service.clone();
        tokio::spawn(async move {
            tokio::pin!(stop);
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stop => return,
                    _ = tick.tick() => {
                        let s = service.limiter.local_tick().await;
                        if s.added > 0 || s.already > 0 || s.refunded > 0 {
                            tracing::info!(added = s.added, refunded = s.refunded, already = s.already, "local spending settled in the store");
                        }
                    }
                }
            }
        });
    }
    let warned = Arc::new(AtomicBool::new(false));
    every_second(stop_beat, move || {
        let service = service.clone();
        let warned = warned.clone();
        async move {
            let limiter = &service.limiter;
            // The first beat waits for the address (known once the HTTP port is
            // bound): a member without it would count as a replica of its own.
            if !limiter.uses_local() || !limiter.local().advertised() {
                return;
            }
            if let Err(e) = limiter.heartbeat().await {
                let local = limiter.local();
                if local.source() == crate::limiter::local::ShareSource::Configured
                    && !warned.swap(true, Ordering::Relaxed)
                {
                    tracing::warn!(
                        error = %e,
                        replicas = local.replicas(),
                        "failure_mode local: the replica count is not known (the store does not answer); \
                         each replica assumes --local-share-replicas"
                    );
                }
            }
        }
    })
}

/// Once the heartbeat has stopped (so no beat lands after it), takes this replica
/// out of the store's count: a replica that stops cleanly is not missing, and the
/// others keep no share back for it. Bounded: an unreachable store leaves the
/// entry to age out.
async fn leave<S: Store>(service: &Service<S>, beating: tokio::task::JoinHandle<()>) {
    let limiter = &service.limiter;
    let left = async {
        let _ = beating.await;
        if limiter.uses_local() {
            // A last try at adding what was decided locally to the shared counters.
            limiter.local_tick().await;
            limiter.leave().await
        } else {
            Ok(())
        }
    };
    match tokio::time::timeout(std::time::Duration::from_secs(2), left).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "failure_mode local: could not leave the replica count")
        }
        Err(_) => tracing::warn!("failure_mode local: leaving the replica count timed out"),
    }
    let local = limiter.local();
    let lost = local.unsettled_hits();
    if lost > 0 {
        // Nobody else holds this spending: the shared counters never see it.
        tracing::warn!(
            counters = local.status().unsettled_counters,
            hits = lost,
            "failure_mode local: spending decided locally is lost with this exit; the shards were not reached"
        );
    }
}

/// `--local-share-service`: the replica count from the Service's EndpointSlices. A
/// client that cannot be configured is a warning, never a failed start: the count
/// then comes from the store or the flag, as without it.
fn replicas_from_service<S: Store>(
    service: Arc<Service<S>>,
    name: ServiceRef,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    tokio::spawn(async move {
        let metrics = service.metrics.clone();
        match ReplicaWatch::connect(&name, metrics.clone()).await {
            Ok(watch) => {
                let learn = move |n| service.limiter.local().learn_from_kubernetes(n);
                watch.run(stop, learn).await;
            }
            Err(e) => {
                metrics.local().kubernetes_failing(true);
                tracing::warn!(
                    service = %name,
                    error = %e,
                    "--local-share-service: cannot configure a Kubernetes client (in-cluster service account or KUBECONFIG); \
                     the replica count comes from the store or --local-share-replicas"
                );
            }
        }
    });
}

/// Runs `work` every second until `stop`.
fn every_second<F, Fut>(
    stop: impl Future<Output = ()> + Send + 'static,
    mut work: F,
) -> tokio::task::JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tick.tick() => work().await,
            }
        }
    })
}

/// Binds both listeners, serves, and on `shutdown` turns readiness off, stops
/// accepting, and waits (at most the grace period) for in-flight calls.
#[allow(clippy::too_many_arguments)]
async fn serve<S, F, Fut>(
    service: Arc<Service<S>>,
    demand: Arc<dyn Demand>,
    cfg: &Serve,
    loaded: Arc<AtomicBool>,
    hub: Arc<crate::source::hub::Hub>,
    stop_tx: watch::Sender<bool>,
    stopped: F,
    rereads: watch::Receiver<()>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()>
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let metrics = &service.metrics;
    // Bad TLS files stop start-up, before any port listens.
    let grpc_tls = tls(cfg.listen.grpc_tls(), "grpc", &[b"h2"], metrics).context("--grpc-tls-*")?;
    let http_tls =
        tls(cfg.listen.http_tls(), "http", &[b"http/1.1"], metrics).context("--http-tls-*")?;
    let admin_tls =
        tls(cfg.listen.admin_tls(), "admin", &[b"h2"], metrics).context("--admin-tls-*")?;
    for t in grpc_tls.iter().chain(&http_tls).chain(&admin_tls) {
        let rereads = rereads.clone();
        tokio::spawn(
            t.clone()
                .watch(cfg.policies.reload_interval, stopped(), rereads),
        );
    }
    // Bad OTEL_* values stop start-up too; nothing connects to the collector yet.
    let tracer = start_tracing(cfg, metrics)?;
    let grpc_listener = bind(cfg.listen.grpc_addr).await.context("--grpc-addr")?;
    let http_listener = bind(cfg.listen.http_addr).await.context("--http-addr")?;
    let grpc_addr = grpc_listener.local_addr()?;
    let http_addr = http_listener.local_addr()?;
    let admin_listener = bind_admin(cfg.listen.admin_addr).await?;
    if service.limiter.store().can_be_away() {
        let probes = service.limiter.store().probes_shards();
        let address = advertise(cfg, http_addr, http_tls.is_some(), probes);
        service.limiter.local().advertise(address);
    }
    let admin_addr = match &admin_listener {
        Some(l) => l.local_addr()?.to_string(),
        None => "off".to_string(),
    };

    let ready = Arc::new(AtomicBool::new(false));
    let (serving, serving_rx) = watch::channel(true);
    let nonzero = |d: std::time::Duration| (!d.is_zero()).then_some(d);
    let max_connections = match cfg.connections.grpc_max_connections {
        0 => open_file_limit().map_or(usize::MAX, |n| (n / 4 * 3).max(1)),
        n => n,
    };
    let guard = Guard {
        max: match cfg.connections.http_max_connections {
            0 => open_file_limit().map_or(usize::MAX, |n| (n / 8).max(1)),
            n => n,
        },
        silence: cfg.connections.handshake_timeout,
        refused: metrics.http_refused(),
    };
    // A request's head (and a /json body) has the bound a handshake has: how long
    // a client may take to send what it began.
    let bound = serve_http::Bound {
        request: cfg.connections.handshake_timeout,
        timed_out: metrics.http_timed_out(),
    };
    let quotas = Quotas::new(
        service.clone(),
        demand,
        Arc::new(SystemClock),
        QuotaSettings {
            ttl: cfg.rlqs.rlqs_assignment_ttl,
            abandon_after: cfg.rlqs.rlqs_abandon_after,
            ..QuotaSettings::default()
        },
    );
    let handler = Grpc::new(service.clone(), serving_rx)
        .with_quotas(quotas)
        .with_tracer(tracer.clone());
    let mut grpc = sluice_grpc::Server::new(handler).settings(sluice_grpc::Settings {
        max_message: cfg.connections.max_request_bytes,
        keepalive_interval: nonzero(cfg.connections.grpc_keepalive_interval),
        keepalive_timeout: cfg.connections.grpc_keepalive_timeout,
        idle_timeout: nonzero(cfg.connections.grpc_idle_timeout),
        handshake_timeout: cfg.connections.handshake_timeout,
        // The same bound as the handshake: how long a client may take to send what
        // it began before it costs the server nothing more.
        message_timeout: cfg.connections.handshake_timeout,
        max_buffered: cfg.connections.grpc_max_buffered_request_bytes,
        max_connections,
    });
    if let Some(t) = grpc_tls.clone() {
        grpc = grpc.tls(move || t.acceptor());
    }
    let connections = grpc.stats();
    let grpc_task = tokio::spawn(grpc.serve(grpc_listener, stopped()));
    let admin_connections = Arc::new(sluice_grpc::Stats::default());
    let admin_task = admin_listener.map(|listener| {
        let limits = crate::admin::Limits {
            max_connections: cfg.connections.admin_max_connections,
            handshake_timeout: cfg.connections.handshake_timeout,
            idle_timeout: nonzero(cfg.connections.grpc_idle_timeout),
            keepalive_interval: nonzero(cfg.connections.grpc_keepalive_interval),
            keepalive_timeout: cfg.connections.grpc_keepalive_timeout,
        };
        let run = crate::admin::serve::run(
            crate::admin::Admin::new(service.clone(), hub.clone(), stop_tx.subscribe()),
            listener,
            admin_tls.clone(),
            limits,
            admin_connections.clone(),
            tracer.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = run.await {
                tracing::error!(error = %e, "admin API stopped");
            }
        })
    });
    let admin = Arc::new(HttpState {
        service: service.clone(),
        ready: ready.clone(),
        max_request_bytes: cfg.connections.max_request_bytes,
        body_timeout: cfg.connections.handshake_timeout,
        connections,
        admin_connections: admin_task.is_some().then_some(admin_connections),
        loaded,
        hub,
        tracer: tracer.clone(),
    });
    let prometheus = match cfg.metrics.prometheus_addr {
        Some(addr) => {
            let listener = bind(addr).await.context("--prometheus-addr")?;
            tracing::info!(prometheus = %listener.local_addr()?, path = %cfg.metrics.prometheus_path, "metrics also served");
            let app = metrics_router(admin.clone(), &cfg.metrics.prometheus_path);
            let listener = guard.wrap(listener, "prometheus");
            let server = serve_http::serve(listener, app, bound.clone(), stopped());
            Some(tokio::spawn(server))
        }
        None => None,
    };
    let app = router(admin);
    let http_stop = stopped();
    let https = http_tls.is_some();
    let http_listener = guard.wrap(http_listener, "http");
    let http_task = match http_tls {
        None => tokio::spawn(serve_http::serve(http_listener, app, bound, http_stop)),
        Some(t) => {
            // The guard under TLS: a connection takes its slot when accepted, not
            // once its handshake is done, so half-open handshakes count too.
            let listener = TlsListener::new(http_listener, t, guard.silence);
            tokio::spawn(serve_http::serve(listener, app, bound, http_stop))
        }
    };

    ready.store(true, Ordering::SeqCst);
    tracing::info!(
        grpc = %grpc_addr,
        http = %http_addr,
        admin = %admin_addr,
        grpc_tls = grpc_tls.is_some(),
        http_tls = https,
        max_connections,
        "sluice listening"
    );
    crate::notify::notify(&format!(
        "READY=1\nSTATUS=serving gRPC on {grpc_addr}, HTTP on {http_addr}, admin {admin_addr}"
    ));

    shutdown.await;
    tracing::info!("shutting down: readiness off, draining in-flight calls");
    crate::notify::notify("STOPPING=1\nSTATUS=draining in-flight calls");
    ready.store(false, Ordering::SeqCst);
    serving.send_replace(false);
    tokio::time::sleep(cfg.shutdown.drain_delay).await;
    let _ = stop_tx.send(true);
    // The gRPC server returns once every stream open at GOAWAY has been answered
    // (health Watch streams end at the stop) and its connections are closed. Then
    // wait for the HTTP calls in flight, not for idle HTTP connections.
    let drained = async {
        let _ = grpc_task.await;
        if let Some(admin) = admin_task {
            let _ = admin.await;
        }
        while service.in_flight() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        http_task.abort();
        if let Some(p) = &prometheus {
            p.abort();
        }
    };
    if tokio::time::timeout(cfg.shutdown.shutdown_grace, drained)
        .await
        .is_err()
    {
        tracing::warn!("grace period over; exiting with calls still in flight");
    }
    if let Some(tracer) = tracer {
        // The last spans, within a bound of their own: a collector that is down
        // must not hold the exit.
        tracer.stop(std::time::Duration::from_secs(2)).await;
    }
    Ok(())
}

/// Where the peers reach this replica's HTTP port (`--local-share-advertise`, else
/// `http`, the bound address, when it is a specific IP), logged once; `None`, and
/// the side channel off, with neither, when the port serves TLS (the peers'
/// questions are plain HTTP), or when a probe cannot answer for a shard (`probes`
/// false: a Redis Cluster).
fn advertise(cfg: &Serve, http: SocketAddr, https: bool, probes: bool) -> Option<String> {
    let address = match &cfg.decisions.local_share_advertise {
        _ if !probes => {
            tracing::info!("local share: the store is a Redis Cluster, whose nodes one probe cannot answer for, so no peer is asked when a node is lost (the others reserve this replica's share once its heartbeat stops)");
            return None;
        }
        _ if https => {
            tracing::info!("local share: the HTTP port serves TLS, so no peer is asked when a shard is lost (the others reserve this replica's share once its heartbeat stops)");
            return None;
        }
        Some(a) => a.clone(),
        None if !http.ip().is_unspecified() => http.to_string(),
        None => {
            tracing::info!(
                http = %http,
                "local share: no address to advertise (--http-addr listens on every interface; set --local-share-advertise), so no peer is asked when a shard is lost"
            );
            return None;
        }
    };
    tracing::info!(address = %address, "local share: peers reach this replica at this address");
    Some(address)
}

/// The tracer `cfg` and the `OTEL_*` variables ask for, if any.
fn start_tracing(cfg: &Serve, metrics: &Metrics) -> anyhow::Result<Option<Arc<Tracer>>> {
    let env = |name: &str| std::env::var(name).ok();
    let Some(settings) = crate::trace::settings(&cfg.tracing, &env)? else {
        return Ok(None);
    };
    let [exported, dropped, failed] = metrics.trace_spans();
    let counters = crate::trace::Counters {
        exported,
        dropped,
        failed,
    };
    let tracer = Tracer::start(&settings, counters)?;
    tracing::info!(
        endpoint = %settings.endpoint,
        protocol = ?settings.protocol,
        sampler = ?settings.sampler,
        "tracing on"
    );
    Ok(Some(Arc::new(tracer)))
}

/// Raises the soft limit on open files to the hard one, as Go programs such as
/// envoyproxy/ratelimit do at start: hosts commonly set a soft limit of 1,024
/// under a far higher hard one, and the connection caps' defaults are shares of
/// the soft limit. Before any port or store connection opens.
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    let (Some(soft), Some(hard)) = (limit.current, limit.maximum) else {
        return;
    };
    if soft >= hard {
        return;
    }
    let raised = rustix::process::Rlimit {
        current: Some(hard),
        maximum: Some(hard),
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => tracing::info!(
            from = soft,
            to = hard,
            "open-file limit raised to the hard limit"
        ),
        Err(error) => {
            tracing::warn!(limit = soft, %error, "cannot raise the open-file limit to the hard limit")
        }
    }
}

/// The soft limit on open files (`ulimit -n`), from /proc/self/limits; `None` when
/// unlimited or unknown.
fn open_file_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// A port's TLS, loaded from `files` when it has any.
fn tls(
    files: Option<TlsFiles>,
    port: &'static str,
    alpn: &[&[u8]],
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Option<Arc<Tls>>> {
    let Some(files) = files else {
        return Ok(None);
    };
    Ok(Some(Arc::new(Tls::load(
        port,
        files,
        alpn,
        metrics.clone(),
        Arc::new(SystemClock),
    )?)))
}

/// Two listening flags naming one port (the same address, or a port on every
/// address and on one of them): the second could not bind, and "address in use"
/// would not say it is Sluice's own flag in the way.
fn same_port(cfg: &Serve) -> Option<String> {
    let mut given = vec![
        ("--grpc-addr", cfg.listen.grpc_addr),
        ("--http-addr", cfg.listen.http_addr),
    ];
    if let Some(AdminAddr::At(addr)) = cfg.listen.admin_addr {
        given.push(("--admin-addr", addr));
    }
    if let Some(addr) = cfg.metrics.prometheus_addr {
        given.push(("--prometheus-addr", addr));
    }
    for (i, (first, a)) in given.iter().enumerate() {
        if let Some((second, b)) = given[i + 1..].iter().find(|(_, b)| overlap(*a, *b)) {
            return Some(format!(
                "{first} {a} and {second} {b} name the same port: give each its own"
            ));
        }
    }
    None
}

/// Whether listening on `a` and on `b` takes one port twice: 0.0.0.0 takes the
/// port on every IPv4 address, [::] on every address; port 0 is any free port.
fn overlap(a: SocketAddr, b: SocketAddr) -> bool {
    let covers = |a: std::net::IpAddr, b: std::net::IpAddr| {
        a == b || (a.is_unspecified() && (a.is_ipv6() || b.is_ipv4()))
    };
    a.port() != 0 && a.port() == b.port() && (covers(a.ip(), b.ip()) || covers(b.ip(), a.ip()))
}

/// The admin port's listener: `None` when off, or when the default address is taken
/// (another sluice on this host), with a warning; an address given must bind.
async fn bind_admin(addr: Option<AdminAddr>) -> anyhow::Result<Option<TcpListener>> {
    match addr {
        Some(AdminAddr::Off) => Ok(None),
        Some(AdminAddr::At(addr)) => Ok(Some(bind(addr).await.context("--admin-addr")?)),
        None => {
            let addr: SocketAddr = DEFAULT_ADMIN_ADDR.parse().expect("a valid default");
            match TcpListener::bind(addr).await {
                Ok(l) => Ok(Some(l)),
                Err(e) => {
                    tracing::warn!(
                        %addr,
                        error = %e,
                        "admin API off: its default address is taken; set --admin-addr"
                    );
                    Ok(None)
                }
            }
        }
    }
}

async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    if addr.ip() == std::net::Ipv6Addr::UNSPECIFIED {
        return bind_every_address(addr.port());
    }
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}

/// `[::]`: every address, IPv4's too (as Go listens on `0.0.0.0` or `:PORT`),
/// whatever `net.ipv6.bindv6only` says; a kernel without IPv6 gets `0.0.0.0`.
fn bind_every_address(port: u16) -> anyhow::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let v6 = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
    let socket = match Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP)) {
        Ok(s) => s,
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            let v4 = SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port));
            tracing::warn!(%v6, %v4, "no IPv6 on this host: listening on IPv4 only");
            let listener = std::net::TcpListener::bind(v4)
                .with_context(|| format!("cannot listen on {v4}"))?;
            listener.set_nonblocking(true)?;
            return Ok(TcpListener::from_std(listener)?);
        }
        Err(e) => return Err(e).with_context(|| format!("cannot listen on {v6}")),
    };
    let listen = |socket: Socket| -> std::io::Result<TcpListener> {
        socket.set_only_v6(false)?;
        socket.set_reuse_address(true)?;
        socket.bind(&v6.into())?;
        socket.listen(1024)?;
        socket.set_nonblocking(true)?;
        TcpListener::from_std(socket.into())
    };
    listen(socket).with_context(|| format!("cannot listen on {v6}"))
}

/// Changes at each SIGHUP, which has the policy and TLS files read at once rather
/// than at the next `--reload-interval`. Handling it also keeps a SIGHUP (a closed
/// terminal, `systemctl reload`, `kill -HUP`) from ending the process.
fn hangups() -> watch::Receiver<()> {
    let (tx, rx) = watch::channel(());
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::hangup()) {
            Ok(mut hup) => {
                tokio::spawn(async move {
                    while hup.recv().await.is_some() {
                        tracing::info!("SIGHUP: reading the policy and TLS files now");
                        tx.send_replace(());
                    }
                });
            }
            Err(e) => tracing::warn!(error = %e, "cannot handle SIGHUP; it would end the process"),
        }
    }
    rx
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed by this call (within
/// the runtime), not when the future is first polled: `serve` polls it only once it
/// listens, and a signal arriving before that would end the process by the default
/// action instead of stopping it gracefully. A second signal during the drain ends
/// the process at once (exit status 1): an operator pressing Ctrl-C again, or a
/// supervisor repeating SIGTERM, means "now".
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).ok();
        let mut interrupt = signal(SignalKind::interrupt()).ok();
        async move {
            next_signal(&mut term, &mut interrupt).await;
            tokio::spawn(async move {
                next_signal(&mut term, &mut interrupt).await;
                tracing::warn!("second signal: exiting now, without waiting for in-flight calls");
                std::process::exit(1);
            });
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The next SIGTERM or SIGINT; never, for a handler that could not be installed.
#[cfg(unix)]
async fn next_signal(
    term: &mut Option<tokio::signal::unix::Signal>,
    interrupt: &mut Option<tokio::signal::unix::Signal>,
) {
    async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
        match s {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    }
    tokio::select! {
        _ = recv(term) => {},
        _ = recv(interrupt) => {},
    }
}

#[cfg(test)]
mod tests {
    use super::overlap;

    #[test]
    fn listening_addresses_overlap_as_linux_binds_them() {
        let o = |a: &str, b: &str| overlap(a.parse().unwrap(), b.parse().unwrap());
        assert!(o("127.0.0.1:80", "127.0.0.1:80"));
        assert!(o("0.0.0.0:80", "127.0.0.1:80"));
        assert!(o("127.0.0.1:80", "0.0.0.0:80"));
        assert!(o("[::]:80", "127.0.0.1:80"));
        assert!(o("0.0.0.0:80", "[::]:80"));
        assert!(!o("0.0.0.0:80", "[::1]:80"));
        assert!(!o("127.0.0.1:80", "127.0.0.2:80"));
        assert!(!o("127.0.0.1:80", "127.0.0.1:81"));
        assert!(!o("127.0.0.1:0", "127.0.0.1:0"));
    }
}
