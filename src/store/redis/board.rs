//! The shared block list ([`crate::store::board`]) in Redis: one script
//! (`board.lua`) on one shard, the first (in a cluster, the slot of the
//! `{sluice-board}` tag), so every replica counts a key's denials and reads its
//! sentence in one place. Only denials of rules with a `penalty`, operators' blocks
//! and the once-a-second listing reach it, never an admitted request.

use std::sync::LazyLock;
use std::time::Duration;

use sluice_redis::Value;

use crate::algorithm::Micros;
use crate::store::{ErrorKind, Kind, Sentenced, StoreError, Strike};

use super::scripts::{Call, Lua};
use super::Inner;

static BOARD: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lua/board.lua")));

/// Longest wait for a listing: off the request path, so not the store timeout.
const LIST_TIMEOUT: Duration = Duration::from_secs(2);

fn keys(prefix: &str, key: Option<&str>) -> Vec<String> {
    let mut k = vec![
        format!("{prefix}{{sluice-board}}:list"),
        format!("{prefix}{{sluice-board}}:info"),
    ];
    if let Some(key) = key {
        k.push(format!("{prefix}{{sluice-board}}:v:{key}"));
        k.push(format!("{prefix}{{sluice-board}}:p:{key}"));
    }
    k
}

fn bad(what: &str) -> StoreError {
    StoreError::failed(ErrorKind::Protocol, format!("board reply: {what}"))
}

fn int(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(*i),
        _ => Err(bad("expected an integer")),
    }
}

fn text(v: &Value) -> Result<String, StoreError> {
    v.as_text().ok_or_else(|| bad("expected a string"))
}

/// A stored record: "kind factor_ppm info".
fn record(key: String, remaining: Micros, rec: &str) -> Option<Sentenced> {
    let mut parts = rec.splitn(3, ' ');
    let kind = Kind::from_code(parts.next()?)?;
    let factor_ppm = parts.next()?.parse().ok()?;
    Some(Sentenced {
        key,
        kind,
        remaining,
        factor_ppm,
        info: parts.next().unwrap_or("").to_string(),
        started: false,
    })
}

impl Inner {
    fn fixed_now_arg(&self) -> String {
        self.fixed_clock
            .as_ref()
            .map(|c| c.now().to_string())
            .unwrap_or_default()
    }

    async fn board(&self, call: &Call<'_>, wait: Duration) -> Result<Value, StoreError> {
        self.invoke_at(0, call, wait).await
    }

    pub(super) async fn strike(&self, s: &Strike<'_>) -> Result<Option<Sentenced>, StoreError> {
        let mut call = BOARD.call();
        for k in keys(&self.prefix, Some(s.key)) {
            call.key(k);
        }
        let (bans, bwithin, bspan) = s.block.unwrap_or((0, 1, 0));
        call.arg("strike")
            .arg(self.fixed_now_arg())
            .arg(s.key)
            .arg(s.violations)
            .arg(s.within)
            .arg(s.kind.code())
            .arg(s.span)
            .arg(s.factor_ppm)
            .arg(bans)
            .arg(bwithin)
            .arg(bspan)
            .arg(s.info)
            .arg(s.denials);
        let reply = self.board(&call, self.call_timeout).await?;
        let Value::Array(items) = reply else {
            return Err(bad("expected an array"));
        };
        if items.is_empty() {
            return Ok(None);
        }
        if items.len() != 5 {
            return Err(bad("expected 5 values"));
        }
        let kind = Kind::from_code(&text(&items[0])?).ok_or_else(|| bad("unknown kind"))?;
        Ok(Some(Sentenced {
            key: s.key.to_string(),
            kind,
            remaining: int(&items[1])?.max(0) as Micros,
            factor_ppm: int(&items[2])?.clamp(0, 1_000_000) as u32,
            info: text(&items[3])?,
            started: int(&items[4])? == 1,
        }))
    }

    pub(super) async fn put(&self, s: &Sentenced) -> Result<(), StoreError> {
        let mut call = BOARD.call();
        for k in keys(&self.prefix, None) {
            call.key(k);
        }
        call.arg("put")
            .arg(self.fixed_now_arg())
            .arg(&s.key)
            .arg(s.kind.code())
            .arg(s.remaining)
            .arg(s.factor_ppm)
            .arg(&s.info);
        self.board(&call, LIST_TIMEOUT).await.map(|_| ())
    }

    pub(super) async fn pardon(&self, key: &str) -> Result<bool, StoreError> {
        let mut call = BOARD.call();
        for k in keys(&self.prefix, Some(key)) {
            call.key(k);
        }
        call.arg("pardon").arg(self.fixed_now_arg()).arg(key);
        Ok(int(&self.board(&call, LIST_TIMEOUT).await?)? == 1)
    }

    pub(super) async fn sentences(&self) -> Result<Vec<Sentenced>, StoreError> {
        let mut call = BOARD.call();
        for k in keys(&self.prefix, None) {
            call.key(k);
        }
        call.arg("list").arg(self.fixed_now_arg());
        let Value::Array(items) = self.board(&call, LIST_TIMEOUT).await? else {
            return Err(bad("expected an array"));
        };
        let Some((now, rest)) = items.split_first() else {
            return Err(bad("empty listing"));
        };
        let now = int(now)?;
        let mut out = Vec::with_capacity(rest.len() / 3);
        for c in rest.chunks_exact(3) {
            let until = int(&c[1])?;
            let left = until.saturating_sub(now).max(0) as Micros;
            if let Some(s) = record(text(&c[0])?, left, &text(&c[2])?) {
                out.push(s);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_and_bad_ones_are_skipped() {
        let s = record("k".into(), 5, "t 100000 [\"d\",\"r\",\"k\",\"penalty\"]").unwrap();
        assert_eq!(s.kind, Kind::Tighten);
        assert_eq!(s.factor_ppm, 100_000);
        assert_eq!(s.info, "[\"d\",\"r\",\"k\",\"penalty\"]");
        assert!(record("k".into(), 5, "x 0 i").is_none());
        assert!(record("k".into(), 5, "b").is_none());
    }

    #[test]
    fn every_board_key_shares_one_cluster_slot() {
        let k = keys("p:", Some("d|ip|{1.2.3.4}"));
        let slots: Vec<u16> = k
            .iter()
            .map(|k| super::super::shard::slot(k.as_bytes()))
            .collect();
        assert!(slots.iter().all(|&s| s == slots[0]), "{k:?} {slots:?}");
    }
}
