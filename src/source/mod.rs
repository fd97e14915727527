//! Policy sources. The file, xDS and Kubernetes sources hand their documents to the
//! [`hub::Hub`], which compiles all of them into one policy and swaps it in whole;
//! the request path only ever loads the current `Arc<Policy>` (no lock).
//! [`replicas`] reads Kubernetes too, for a replica count rather than policies.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::Serve;
use crate::policy::Policy;
use crate::telemetry::printable::printable;
use crate::telemetry::Metrics;

/// Longest start-up wait for the first RateLimitPolicy list.
const FIRST_LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

pub mod claim;
pub mod file;
pub mod hub;
pub mod kube;
pub mod raw_policy;
pub mod replicas;
pub mod xds;

/// What the sources give the server.
pub struct Sources {
    /// The policy the request path reads.
    pub policy: Arc<ArcSwap<Policy>>,
    /// True once every source that must deliver before readiness has: the xDS
    /// source's first accepted version (unless `--xds-start-without-config`).
    pub loaded: Arc<AtomicBool>,
    /// Where the sources meet, for what they say beside the policy
    /// (`/debug/policies`).
    pub hub: Arc<hub::Hub>,
}

/// Loads the `--config` files, connects to Kubernetes with `--kube`, subscribes to
/// `--xds-server`, and spawns the sources; each stops when a future made by
/// `stopped` resolves. Fails when the files do not load, the xDS settings are bad
/// or no Kubernetes client can be configured.
pub async fn start<F, Fut>(
    cfg: &Serve,
    metrics: Arc<Metrics>,
    stopped: F,
    rereads: &tokio::sync::watch::Receiver<()>,
) -> anyhow::Result<Sources>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let defaults = crate::policy::Defaults {
        algorithm: cfg.decisions.default_algorithm,
        shadow_mode: cfg.decisions.shadow_mode,
    };
    let hub = hub::Hub::new(&cfg.policies.shared_domains, defaults, metrics.clone());
    if !cfg.policies.config.is_empty() {
        let files = file::FileSource::load(
            cfg.policies.config.clone(),
            cfg.policies.config_dir_files,
            cfg.policies.reload_interval,
            metrics.clone(),
            hub.clone(),
        )
        .map_err(|errors| {
            // A policy's keys and names may hold a terminal's control sequences.
            let lines: Vec<String> = errors
                .iter()
                .map(|e| printable(&e.to_string()).into_owned())
                .collect();
            anyhow::anyhow!("policies do not load:\n{}", lines.join("\n"))
        })?;
        tokio::spawn(files.run(stopped(), rereads.clone()));
    }
    let loaded = Arc::new(AtomicBool::new(true));
    if let Some(url) = &cfg.xds.xds_server {
        loaded.store(
            cfg.xds.xds_start_without_config,
            std::sync::atomic::Ordering::SeqCst,
        );
        let source =
            xds::XdsSource::new(&cfg.xds, url, hub.clone(), metrics.clone(), loaded.clone())?;
        tokio::spawn(source.run(stopped()));
    }
    if cfg.policies.kube {
        metrics.declare_policy_source("kube");
        let kube =
            kube::KubeSource::connect(cfg.policies.kube_namespace.clone(), hub.clone()).await?;
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(kube.run(stopped(), first_tx));
        // Serve the cluster's policies from the first request: wait for the first
        // list (normally milliseconds). A failing first attempt (CRD not installed,
        // API server away) ends the wait at once; the watch keeps retrying.
        if tokio::time::timeout(FIRST_LIST_WAIT, first_rx)
            .await
            .is_err()
        {
            tracing::warn!(
                "no RateLimitPolicy list after {FIRST_LIST_WAIT:?}; starting without them, the watch keeps trying"
            );
        }
    }
    Ok(Sources {
        policy: hub.policy(),
        loaded,
        hub,
    })
}
