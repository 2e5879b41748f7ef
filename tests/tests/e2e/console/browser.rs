//! A headless Chromium driven over WebDriver: `chromedriver` started on a free port (killed on
//! Drop) and a fantoccini session on it, plus a plain HTTP/1.1 client for the requests a
//! browser would not make (a POST without the form's token, a bearer header).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// A browser session; close it with [`Browser::close`] (Drop kills the driver anyway).
pub(crate) struct Browser {
    pub(crate) client: Client,
    driver: Child,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session (1280x1000).
    pub(crate) async fn start() -> Browser {
        Browser::start_with(&[], None).await
    }

    /// [`Browser::start`] with more Chromium arguments (`--blink-settings=...`) and the
    /// browser's time zone (`TZ` of the driver and the browser it starts).
    pub(crate) async fn start_with(extra_args: &[&str], zone: Option<&str>) -> Browser {
        for tool in [CHROMEDRIVER, CHROMIUM] {
            assert!(
                std::path::Path::new(tool).exists(),
                "{tool} is missing: install Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
            );
        }
        let port = jetsched_tests::free_addr().port();
        let mut driver = Command::new(CHROMEDRIVER);
        if let Some(zone) = zone {
            driver.env("TZ", zone);
        }
        let driver = driver
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        jetsched_tests::eventually(Duration::from_secs(20), "chromedriver listens", || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok()
        })
        .await;
        let mut args = vec![
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,1000",
            "--hide-scrollbars",
        ];
        args.extend_from_slice(extra_args);
        let mut capabilities = serde_json::Map::new();
        capabilities
            .insert("goog:chromeOptions".into(), serde_json::json!({ "binary": CHROMIUM, "args": args }));
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&url)
            .await
            .expect("a WebDriver session on chromedriver");
        Browser { client, driver }
    }

    /// The text of the first element matching `css` (empty when there is none).
    pub(crate) async fn text(&self, css: &str) -> String {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => element.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// Clicks the first element matching `css`; fails when there is none.
    pub(crate) async fn click(&self, css: &str) {
        let element = self.client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("no {css}: {e}"));
        element.click().await.unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Types `text` into the first element matching `css`; fails when there is none.
    pub(crate) async fn type_into(&self, css: &str, text: &str) {
        let element = self.client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("no {css}: {e}"));
        element.send_keys(text).await.unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// Waits, without refreshing, until the text of the first element matching `css` satisfies
    /// `ready` (a click that submits a form returns before the next page has loaded), and
    /// returns that text; fails naming `what` after `within`.
    pub(crate) async fn text_when(
        &self,
        within: Duration,
        what: &str,
        css: &str,
        ready: impl Fn(&str) -> bool,
    ) -> String {
        jetsched_tests::eventually(within, what, || async { ready(&self.text(css).await) }).await;
        self.text(css).await
    }

    /// Refreshes the page until `ready` holds for the text of the first element matching
    /// `css`; fails naming `what` after `within`.
    pub(crate) async fn refresh_until(
        &self,
        within: Duration,
        what: &str,
        css: &str,
        ready: impl Fn(&str) -> bool,
    ) {
        jetsched_tests::eventually(within, what, || async {
            if ready(&self.text(css).await) {
                return true;
            }
            self.client.refresh().await.expect("refresh the page");
            false
        })
        .await;
    }

    /// Writes a screenshot of the window to `<dir>/<name>.png` when
    /// `JETSCHED_CONSOLE_SCREENSHOTS=<dir>` is set.
    pub(crate) async fn screenshot(&self, dir: Option<&PathBuf>, name: &str) {
        let Some(dir) = dir else { return };
        std::fs::create_dir_all(dir).expect("create the screenshot directory");
        let png = self.client.screenshot().await.expect("screenshot");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("write the screenshot");
    }

    pub(crate) async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill().await;
    }
}

/// A response of [`http_request`].
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) head: String,
    pub(crate) body: String,
}

impl Reply {
    /// The value of header `name` (case-insensitive), if present.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

/// One HTTP/1.1 request to the console (`Connection: close`) with extra header lines and a
/// form body.
pub(crate) async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
    form: &str,
) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect to the console");
    let mut text = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for header in headers {
        text.push_str(header);
        text.push_str("\r\n");
    }
    if method == "POST" {
        text.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            form.len()
        ));
    }
    text.push_str("\r\n");
    text.push_str(form);
    stream.write_all(text.as_bytes()).await.expect("send the request");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut raw))
        .await
        .expect("the console answers")
        .expect("read the reply");
    let raw = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Reply { status, head: head.to_string(), body: body.to_string() }
}

/// The CSRF token in a page's action forms.
pub(crate) fn csrf_of(page: &str) -> String {
    let marker = r#"name="csrf" value=""#;
    let start = page.find(marker).expect("the page has an action form") + marker.len();
    page[start..].split('"').next().unwrap().to_string()
}
