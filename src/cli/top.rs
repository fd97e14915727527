//! `sluice top`: a live terminal view of a running sluice's admin API: rules with
//! decided and denied per second and the deny ratio, the selected rule's top
//! offending keys, and the penalty bans in force, from WatchOffenders.
//!
//! The stream is read by a task of the runtime; the screen and the keyboard by a
//! blocking thread, which takes each snapshot from a channel between key polls.

use std::sync::mpsc;
use std::time::Duration;

use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table, TableState};
use ratatui::Frame;

use super::connect::{connect, unanswered_in_time, ConnectArgs, ConnectError, ANSWER_WAIT};
use crate::admin::pb;
use crate::errors::chain;
use crate::telemetry::printable::printable;

/// The window the offenders' counts cover (WatchOffenders' 60 s).
const WINDOW_SECS: f64 = 60.0;

/// `sluice top` settings.
#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Only this domain (default: every domain).
    #[arg(long, default_value = "", hide_default_value = true)]
    pub domain: String,
    /// Time between updates.
    #[arg(long, default_value = "1s", value_parser = crate::config::parse_duration)]
    pub interval: Duration,
}

/// Why `sluice top` stopped other than by the user.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("the admin API answered: {0}")]
    Call(String),
    #[error("the terminal: {0}")]
    Terminal(String),
    #[error("the output is not a terminal: sluice top draws a live screen; for a script, read WatchOffenders (grpcurl) or GET /debug/top")]
    NotATerminal,
}

/// How the rules are ordered; `s` moves to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sort {
    DenyRatio,
    Denied,
    Decided,
    Name,
}

impl Sort {
    fn next(self) -> Sort {
        match self {
            Sort::DenyRatio => Sort::Denied,
            Sort::Denied => Sort::Decided,
            Sort::Decided => Sort::Name,
            Sort::Name => Sort::DenyRatio,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Sort::DenyRatio => "deny ratio",
            Sort::Denied => "denied",
            Sort::Decided => "decided",
            Sort::Name => "name",
        }
    }
}

/// What the screen shows, apart from the terminal.
#[derive(Debug)]
pub struct View {
    pub server: String,
    pub snapshot: Option<pb::TopSnapshot>,
    pub sort: Sort,
    /// Rules whose `domain/rule` or offending keys contain this are shown.
    pub filter: String,
    pub editing: bool,
    pub selected: usize,
    /// The stream's end or error, shown until the user quits.
    pub problem: Option<String>,
}

impl View {
    pub fn new(server: String) -> View {
        View {
            server,
            snapshot: None,
            sort: Sort::DenyRatio,
            filter: String::new(),
            editing: false,
            selected: 0,
            problem: None,
        }
    }

    /// The rules shown, filtered and sorted.
    pub fn rules(&self) -> Vec<&pb::RuleTop> {
        let Some(s) = &self.snapshot else {
            return Vec::new();
        };
        let f = self.filter.as_str();
        let mut rules: Vec<&pb::RuleTop> = s
            .rules
            .iter()
            .filter(|r| {
                f.is_empty()
                    || format!("{}/{}", r.domain, r.rule).contains(f)
                    || r.offenders.iter().any(|o| shows(&o.key, f))
            })
            .collect();
        let name = |r: &&pb::RuleTop| (r.domain.clone(), r.rule.clone());
        match self.sort {
            Sort::DenyRatio => rules.sort_by(|a, b| {
                b.deny_ratio
                    .total_cmp(&a.deny_ratio)
                    .then(name(a).cmp(&name(b)))
            }),
            Sort::Denied => {
                rules.sort_by(|a, b| b.denied.cmp(&a.denied).then(name(a).cmp(&name(b))))
            }
            Sort::Decided => {
                rules.sort_by(|a, b| b.decided.cmp(&a.decided).then(name(a).cmp(&name(b))))
            }
            Sort::Name => rules.sort_by_key(name),
        }
        rules
    }

    /// The bans and blocks shown: those whose domain/rule or key holds the filter.
    pub fn bans(&self) -> Vec<&pb::Ban> {
        let f = self.filter.as_str();
        self.snapshot
            .iter()
            .flat_map(|s| &s.bans)
            .filter(|b| {
                f.is_empty() || format!("{}/{}", b.domain, b.rule).contains(f) || shows(&b.key, f)
            })
            .collect()
    }

    /// Applies one key; `false` when it quits.
    pub fn key(&mut self, code: KeyCode, modifiers: KeyModifiers) -> bool {
        if code == KeyCode::Char('c') && modifiers.contains(KeyModifiers::CONTROL) {
            return false;
        }
        if self.editing {
            match code {
                KeyCode::Enter | KeyCode::Esc => self.editing = false,
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) => self.filter.push(c),
                _ => {}
            }
            self.selected = 0;
            return true;
        }
        match code {
            KeyCode::Char('q') | KeyCode::Esc => return false,
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('/') => self.editing = true,
            KeyCode::Char('c') => self.filter.clear(),
            // The selection stays on a rule shown, so that up moves from the last
            // rule however often down was pressed there.
            KeyCode::Down | KeyCode::Char('j') => {
                let last = self.rules().len().saturating_sub(1);
                self.selected = self.selected.saturating_add(1).min(last);
            }
            KeyCode::Up | KeyCode::Char('k') => {
                let last = self.rules().len().saturating_sub(1);
                self.selected = self.selected.min(last).saturating_sub(1);
            }
            _ => {}
        }
        true
    }

    /// Draws the whole screen. A terminal too short for every pane drops the top
    /// keys and bans first, then the rules, and says so on its last line.
    pub fn draw(&self, frame: &mut Frame) {
        let rules = self.rules();
        let selected = self.selected.min(rules.len().saturating_sub(1));
        let fit = Fit::of(frame.area().height);
        // The rows of a table too short to show go unused; the last line stays last.
        let [head, table, detail, _, help] = Layout::vertical([
            Constraint::Length(fit.head),
            Constraint::Length(fit.table),
            Constraint::Length(fit.detail),
            Constraint::Fill(1),
            Constraint::Length(1),
        ])
        .areas(frame.area());
        let state = match (&self.problem, &self.snapshot) {
            (Some(p), _) => printable(p).into_owned(),
            (None, None) => "waiting for the first snapshot".to_string(),
            (None, Some(_)) => "live".to_string(),
        };
        let filter = if self.editing {
            format!("filter: {}_", self.filter)
        } else if self.filter.is_empty() {
            String::new()
        } else {
            format!("filter: {}", self.filter)
        };
        frame.render_widget(
            Paragraph::new(format!(
                "sluice top  {}  sort: {}  {}  {}",
                self.server,
                self.sort.as_str(),
                filter,
                state
            )),
            head,
        );
        let rows = rules.iter().map(|r| {
            let top = r.offenders.first().map(|o| o.key.as_str()).unwrap_or("");
            Row::new(vec![
                printable(&r.domain).into_owned(),
                printable(&r.rule).into_owned(),
                format!("{:.1}", r.decided as f64 / WINDOW_SECS),
                format!("{:.1}", r.denied as f64 / WINDOW_SECS),
                format!("{:.1}%", r.deny_ratio * 100.0),
                format!("{:.1}", r.spent as f64 / WINDOW_SECS),
                printable(top).into_owned(),
            ])
        });
        let mut table_state = TableState::default().with_selected(Some(selected));
        frame.render_stateful_widget(
            Table::new(
                rows,
                [
                    Constraint::Length(12),
                    Constraint::Length(20),
                    Constraint::Length(11),
                    Constraint::Length(10),
                    Constraint::Length(8),
                    Constraint::Length(10),
                    Constraint::Min(10),
                ],
            )
            .header(
                Row::new([
                    "domain",
                    "rule",
                    "decided/s",
                    "denied/s",
                    "denied",
                    "cost/s",
                    "top key",
                ])
                .style(Style::new().add_modifier(Modifier::BOLD)),
            )
            .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
            .block(Block::bordered().title("rules (last 60 s)")),
            table,
            &mut table_state,
        );
        let [offenders, bans] =
            Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)])
                .areas(detail);
        let mut lines: Vec<Line> = Vec::new();
        if let Some(r) = rules.get(selected) {
            for (i, o) in r.offenders.iter().enumerate() {
                lines.push(Line::from(format!(
                    "{:>2}. {}  {} denied",
                    i + 1,
                    printable(&o.key),
                    o.denials
                )));
            }
        }
        let inner = usize::from(detail.height.saturating_sub(2));
        let mut title = rules.get(selected).map_or("top keys".to_string(), |r| {
            format!(
                "top keys of {}/{}",
                printable(&r.domain),
                printable(&r.rule)
            )
        });
        push_shown(&mut title, inner, lines.len());
        frame.render_widget(
            Paragraph::new(lines).block(Block::bordered().title(title)),
            offenders,
        );
        let ban_lines: Vec<Line> = self
            .bans()
            .into_iter()
            .map(|b| {
                Line::from(format!(
                    "{} {}/{} {}  {}s left",
                    printable(&b.kind),
                    printable(&b.domain),
                    printable(&b.rule),
                    printable(&b.key),
                    b.remaining_micros.div_ceil(1_000_000)
                ))
            })
            .collect();
        let mut title = "bans and blocks".to_string();
        push_shown(&mut title, inner, ban_lines.len());
        frame.render_widget(
            Paragraph::new(ban_lines).block(Block::bordered().title(title)),
            bans,
        );
        let help_text = match fit.dropped() {
            Some(dropped) => format!(
                "terminal too small for {dropped}: {} rows, {} needed",
                fit.rows,
                Fit::NEEDED
            ),
            None => "q quit  s sort  / filter  c clear filter  up/down select".to_string(),
        };
        frame.render_widget(Paragraph::new(help_text), help);
    }
}

/// Whether `key` holds the filter `f`, as sent or as the screen shows it
/// ([`printable`]): a key the screen shows as `bob\rcarol` is found by what the
/// operator reads.
fn shows(key: &str, f: &str) -> bool {
    key.contains(f) || printable(key).contains(f)
}

/// How the screen's rows are shared: the head line, the rules table, the panes of
/// top keys and bans, and the last line (keys, or what did not fit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fit {
    rows: u16,
    head: u16,
    table: u16,
    detail: u16,
}

impl Fit {
    /// The rules table at its smallest: borders, column names and one rule.
    const TABLE_MIN: u16 = 4;
    /// The table as tall as it is kept while the panes below shrink.
    const TABLE_KEPT: u16 = 5;
    /// The panes at their smallest (borders and one line), and in full (ten keys).
    const DETAIL_MIN: u16 = 3;
    const DETAIL_FULL: u16 = 12;
    /// Rows for every pane: head, table, panes, last line.
    const NEEDED: u16 = 2 + Self::TABLE_MIN + Self::DETAIL_MIN;

    fn of(rows: u16) -> Fit {
        let head = u16::from(rows >= 2);
        let body = rows.saturating_sub(head + 1);
        let detail = if body >= Self::TABLE_KEPT + Self::DETAIL_MIN {
            (body - Self::TABLE_KEPT).min(Self::DETAIL_FULL)
        } else if body >= Self::TABLE_MIN + Self::DETAIL_MIN {
            body - Self::TABLE_MIN
        } else {
            0
        };
        let table = body - detail;
        Fit {
            rows,
            head,
            table: if table >= Self::TABLE_MIN { table } else { 0 },
            detail,
        }
    }

    /// The panes left out, if any.
    fn dropped(self) -> Option<&'static str> {
        match (self.table, self.detail) {
            (0, _) => Some("the rules, top keys and bans"),
            (_, 0) => Some("the top keys and bans"),
            _ => None,
        }
    }
}

/// Appends " (n of total)" to a pane's title when its `inner` rows show only part
/// of its `total` lines.
fn push_shown(title: &mut String, inner: usize, total: usize) {
    if inner < total {
        use std::fmt::Write;
        let _ = write!(title, " ({inner} of {total})");
    }
}

/// Runs the view until the user quits.
pub async fn run(args: &TopArgs) -> Result<(), TopError> {
    use std::io::IsTerminal;
    // The flags first, then the terminal: drawing into a pipe or a file would fail
    // only after the connection, with the terminal's bare OS error.
    args.connect.url()?;
    if !std::io::stdout().is_terminal() {
        return Err(TopError::NotATerminal);
    }
    let mut client = connect(&args.connect).await?;
    let filter = pb::Filter {
        domain: args.domain.clone(),
        interval_ms: args.interval.as_millis().clamp(100, u128::from(u32::MAX)) as u32,
        ..Default::default()
    };
    let answer = tokio::time::timeout(ANSWER_WAIT, client.watch_offenders(filter))
        .await
        .map_err(|_| unanswered_in_time(&args.connect.server))?;
    let mut feed = match answer {
        Ok(feed) => feed.into_inner(),
        Err(s) => {
            return Err(match super::probe::unanswered(&args.connect, &s).await {
                Some(e) => TopError::Connect(e),
                None => TopError::Call(super::connect::status_text(&s)),
            })
        }
    };
    let (tx, rx) = mpsc::channel::<Result<pb::TopSnapshot, String>>();
    let reader = tokio::spawn(async move {
        loop {
            let next = match feed.message().await {
                Ok(Some(s)) => Ok(s),
                Ok(None) => Err("the server ended the stream".to_string()),
                Err(s) => Err(format!("the stream failed: {}", s.message())),
            };
            let last = next.is_err();
            if tx.send(next).is_err() || last {
                return;
            }
        }
    });
    let server = args.connect.server.clone();
    let shown = tokio::task::spawn_blocking(move || screen(View::new(server), rx)).await;
    reader.abort();
    match shown {
        Ok(result) => result,
        Err(e) => Err(TopError::Terminal(e.to_string())),
    }
}

/// The terminal loop: draws, takes snapshots, reads keys; restores the terminal
/// however it ends.
fn screen(
    mut view: View,
    rx: mpsc::Receiver<Result<pb::TopSnapshot, String>>,
) -> Result<(), TopError> {
    let mut terminal = ratatui::try_init().map_err(|e| TopError::Terminal(chain(&e)))?;
    let result = (|| -> std::io::Result<()> {
        loop {
            while let Ok(next) = rx.try_recv() {
                match next {
                    Ok(s) => view.snapshot = Some(s),
                    Err(p) => view.problem = Some(p),
                }
            }
            terminal.draw(|f| view.draw(f))?;
            if event::poll(Duration::from_millis(100))? {
                if let Event::Key(k) = event::read()? {
                    if k.kind == KeyEventKind::Press && !view.key(k.code, k.modifiers) {
                        return Ok(());
                    }
                }
            }
        }
    })();
    ratatui::restore();
    result.map_err(|e| TopError::Terminal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, decided: u64, denied: u64, key: &str) -> pb::RuleTop {
        pb::RuleTop {
            domain: "api".into(),
            rule: name.into(),
            decided,
            denied,
            deny_ratio: denied as f64 / decided as f64,
            offenders: vec![pb::Offender {
                key: key.into(),
                denials: denied,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn keys_sort_filter_and_quit() {
        let mut v = View::new("s".into());
        v.snapshot = Some(pb::TopSnapshot {
            rules: vec![
                rule("a", 100, 10, "k1"),
                rule("b", 10, 5, "k2"),
                rule("c", 1000, 20, "k3"),
            ],
            ..Default::default()
        });
        let names = |v: &View| v.rules().iter().map(|r| r.rule.clone()).collect::<Vec<_>>();
        assert_eq!(names(&v), ["b", "a", "c"], "deny ratio first");
        assert!(v.key(KeyCode::Char('s'), KeyModifiers::NONE));
        assert_eq!(names(&v), ["c", "a", "b"], "denied");
        v.key(KeyCode::Char('s'), KeyModifiers::NONE);
        assert_eq!(names(&v), ["c", "a", "b"], "decided");
        v.key(KeyCode::Char('s'), KeyModifiers::NONE);
        assert_eq!(names(&v), ["a", "b", "c"], "name");
        v.key(KeyCode::Char('/'), KeyModifiers::NONE);
        v.key(KeyCode::Char('k'), KeyModifiers::NONE);
        v.key(KeyCode::Char('2'), KeyModifiers::NONE);
        v.key(KeyCode::Enter, KeyModifiers::NONE);
        assert_eq!(names(&v), ["b"], "a key filters while editing, not moves");
        v.key(KeyCode::Char('c'), KeyModifiers::NONE);
        assert_eq!(names(&v).len(), 3);
        assert!(!v.key(KeyCode::Char('q'), KeyModifiers::NONE));
        assert!(!v.key(KeyCode::Char('c'), KeyModifiers::CONTROL));
    }

    /// Down stops at the last rule shown, so one up always moves.
    #[test]
    fn up_moves_from_the_last_rule_however_often_down_was_pressed() {
        let mut v = View::new("s".into());
        v.snapshot = Some(pb::TopSnapshot {
            rules: vec![rule("a", 100, 10, "k1"), rule("b", 10, 5, "k2")],
            ..Default::default()
        });
        for _ in 0..5 {
            v.key(KeyCode::Down, KeyModifiers::NONE);
        }
        assert_eq!(v.selected, 1, "down stops at the last rule");
        v.key(KeyCode::Up, KeyModifiers::NONE);
        assert_eq!(v.selected, 0, "one up selects the rule above");
    }

    /// The screen drawn on a terminal of `width` x `height`, a line a row.
    fn drawn(v: &View, width: u16, height: u16) -> Vec<String> {
        let mut terminal =
            ratatui::Terminal::new(ratatui::backend::TestBackend::new(width, height)).unwrap();
        terminal.draw(|f| v.draw(f)).unwrap();
        let buffer = terminal.backend().buffer();
        (0..height)
            .map(|y| {
                (0..width)
                    .map(|x| buffer[(x, y)].symbol())
                    .collect::<String>()
            })
            .collect()
    }

    fn crowded() -> View {
        let mut v = View::new("s".into());
        let mut rules: Vec<pb::RuleTop> = (0..8)
            .map(|i| rule(&format!("r{i}"), 100, 10 + i, "k"))
            .collect();
        rules[7].offenders = (1..=10)
            .map(|i| pb::Offender {
                key: format!("key{i}"),
                denials: 100 - i,
            })
            .collect();
        let ban = |key: &str| pb::Ban {
            kind: "ban".into(),
            domain: "api".into(),
            rule: "r7".into(),
            key: key.into(),
            ..Default::default()
        };
        v.snapshot = Some(pb::TopSnapshot {
            rules,
            bans: vec![ban("key1"), ban("key2"), ban("key3")],
            ..Default::default()
        });
        v
    }

    /// A tall terminal shows every pane in full and the keys' help.
    #[test]
    fn a_tall_terminal_shows_every_pane_in_full() {
        let screen = drawn(&crowded(), 100, 30).join("\n");
        for text in [
            "rules (last 60 s)",
            "r7",
            "top keys of api/r7─",
            "10. key10",
            "bans and blocks─",
            "q quit",
        ] {
            assert!(screen.contains(text), "{text:?} in\n{screen}");
        }
        assert!(!screen.contains("too small"), "{screen}");
    }

    /// Shorter, the panes show what fits and say how much that is; shorter still,
    /// the last line says which panes did not fit, never a pane cut to its border.
    #[test]
    fn a_short_terminal_shows_what_fits_and_says_what_does_not() {
        let v = crowded();
        let screen = drawn(&v, 100, 12);
        let all = screen.join("\n");
        assert!(all.contains("top keys of api/r7 (3 of 10)"), "{all}");
        assert!(all.contains("1. key1"), "{all}");
        assert!(all.contains("bans and blocks─"), "{all}");
        assert!(!all.contains("too small"), "{all}");

        for rows in [8, 7, 6] {
            let screen = drawn(&v, 100, rows);
            let all = screen.join("\n");
            assert!(
                all.contains("rules (last 60 s)") && all.contains("r7"),
                "{rows}: {all}"
            );
            assert!(!all.contains("top keys of"), "{rows}: {all}");
            assert_eq!(
                screen.last().unwrap().trim_end(),
                format!("terminal too small for the top keys and bans: {rows} rows, 9 needed"),
                "{all}"
            );
        }
        for rows in [1, 3, 5] {
            let screen = drawn(&v, 100, rows);
            assert_eq!(
                screen.last().unwrap().trim_end(),
                format!(
                    "terminal too small for the rules, top keys and bans: {rows} rows, 9 needed"
                ),
                "{}",
                screen.join("\n")
            );
        }
        // Every pane from 9 rows on.
        let all = drawn(&v, 100, 9).join("\n");
        assert!(all.contains("top keys of api/r7 (1 of 10)"), "{all}");
        assert!(!all.contains("too small"), "{all}");
    }

    /// Keys clients chose show escaped, each as itself: a newline or carriage
    /// return neither hides the rest of the key nor joins it to pose as another, a
    /// bidirectional override does not reach the terminal to reorder the line, an
    /// invisible character does not make two keys look alike. The filter finds a
    /// key by what the screen shows.
    #[test]
    fn keys_clients_chose_show_escaped_each_as_itself() {
        let hostile = [
            "alice\nforged",
            "bob\rcarol",
            "user\u{202e}gnp.exe",
            "adm\u{200b}in",
            "\u{1b}]52;c;aGk=\u{7}",
        ];
        let mut v = View::new("s".into());
        let mut r = rule("user", 100, 50, hostile[0]);
        r.offenders = hostile
            .iter()
            .map(|k| pb::Offender {
                key: k.to_string(),
                denials: 10,
            })
            .collect();
        v.snapshot = Some(pb::TopSnapshot {
            rules: vec![r],
            bans: vec![pb::Ban {
                kind: "ban".into(),
                domain: "api".into(),
                rule: "user".into(),
                key: "bob\rcarol".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        let screen = drawn(&v, 160, 30).join("\n");
        for shown in [
            "alice\\nforged  10 denied",
            "bob\\rcarol  10 denied",
            "user\\u{202e}gnp.exe",
            "adm\\u{200b}in",
            "\\u{1b}]52;c;aGk=\\u{7}",
            "ban api/user bob\\rcarol",
        ] {
            assert!(screen.contains(shown), "{shown:?} in\n{screen}");
        }
        assert!(!screen.contains("bobcarol"), "{screen}");
        assert!(!screen.contains("admin"), "{screen}");
        assert!(
            !screen.contains(|c: char| c.is_control() && c != '\n' || c == '\u{202e}'),
            "{screen:?}"
        );
        v.key(KeyCode::Char('/'), KeyModifiers::NONE);
        for c in "bob\\rcarol".chars() {
            v.key(KeyCode::Char(c), KeyModifiers::NONE);
        }
        v.key(KeyCode::Enter, KeyModifiers::NONE);
        assert_eq!(v.rules().len(), 1);
        assert_eq!(v.bans().len(), 1);
    }

    /// The filter narrows the bans and blocks panel as it narrows the rules.
    #[test]
    fn the_filter_narrows_the_bans_too() {
        let ban = |rule: &str, key: &str| pb::Ban {
            domain: "api".into(),
            rule: rule.into(),
            key: key.into(),
            ..Default::default()
        };
        let mut v = View::new("s".into());
        v.snapshot = Some(pb::TopSnapshot {
            bans: vec![ban("path", "/login*"), ban("remote_address", "10.0.0.1")],
            ..Default::default()
        });
        let keys = |v: &View| v.bans().iter().map(|b| b.key.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&v).len(), 2);
        let filter = |v: &mut View, text: &str| {
            v.key(KeyCode::Char('c'), KeyModifiers::NONE);
            v.key(KeyCode::Char('/'), KeyModifiers::NONE);
            text.chars()
                .for_each(|c| _ = v.key(KeyCode::Char(c), KeyModifiers::NONE));
            v.key(KeyCode::Enter, KeyModifiers::NONE);
        };
        filter(&mut v, "remote");
        assert_eq!(keys(&v), ["10.0.0.1"], "by rule");
        filter(&mut v, "login");
        assert_eq!(keys(&v), ["/login*"], "by key");
        filter(&mut v, "zzz");
        assert!(keys(&v).is_empty(), "matching nothing");
    }
}
