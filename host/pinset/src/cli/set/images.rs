//! `pinset set from-images NAME IMAGE… [--file LIST]`: a set from images as people name them.

use super::{Asked, Common, Gathered};
use anyhow::{Result, bail};
use pinset_registry::mirrors::Target;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct FromImagesArgs {
    /// The set's name (metadata.name).
    pub name: String,
    /// Images: `[host[:port]/]path[:tag]` or `…@sha256:<digest>` (checked to exist).
    pub images: Vec<String>,
    /// More images, one per line (blank lines and # comments skipped; - for standard input).
    #[arg(long, value_name = "LIST")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub common: Common,
}

pub async fn run(args: &FromImagesArgs) -> Result<ExitCode> {
    super::check_name(&args.name)?;
    args.common.check()?;
    let wanted = wanted(args)?;
    if wanted.is_empty() {
        bail!("no image: give IMAGEs or --file LIST");
    }
    let sizer = args.common.sizer()?;
    let mut gathered = Gathered::default();
    let (failed, asked) = super::resolve_all(&sizer, &wanted, &mut gathered).await?;
    if let Some(code) = super::unresolved(&args.common, &failed, asked) {
        return Ok(code);
    }
    super::print(&args.common, &args.name, "images", &gathered)
}

/// The images of the arguments, then of `--file`, parsed.
fn wanted(args: &FromImagesArgs) -> Result<Vec<Asked>> {
    let mut out = Vec::new();
    for given in &args.images {
        let target = Target::parse(given).map_err(anyhow::Error::msg)?;
        out.push(Asked {
            given: given.clone(),
            target,
            found_in: None,
        });
    }
    if let Some(file) = &args.file {
        out.extend(read_list(file)?);
    }
    Ok(out)
}

/// A list of images, one per line; a bad line is an error at FILE:LINE.
fn read_list(file: &Path) -> Result<Vec<Asked>> {
    let text = crate::cli::read_input(file, Some("--file"))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line
            .split_once('#')
            .map_or(line, |(before, _)| before)
            .trim();
        if line.is_empty() {
            continue;
        }
        let target = Target::parse(line)
            .map_err(|why| anyhow::anyhow!("{}:{}: {why}", file.display(), n + 1))?;
        out.push(Asked {
            given: line.to_string(),
            target,
            found_in: None,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_line_of_the_list_is_named_at_its_line() {
        let (_dir, list) = pinset_testkit::scratch_file(
            "images.txt",
            "# release\nquay.io/a/b:v1  # pinned\n\nquay.io/A:v1\n",
        );
        let e = read_list(&list).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:4: ", list.display())), "{e}");
        std::fs::write(&list, "# release\nquay.io/a/b:v1  # pinned\n\nbusybox\n").unwrap();
        let ok = read_list(&list).unwrap();
        assert_eq!(
            ok.iter().map(|w| w.target.full()).collect::<Vec<_>>(),
            ["quay.io/a/b:v1", "docker.io/library/busybox:latest"]
        );
    }
}
