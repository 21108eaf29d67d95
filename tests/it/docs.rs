//! The manual is true to the code: its generated pages are current, the README stays a short
//! front page, and every page the book's summary names exists and links only to files that do.

use crate::support::{self, pinset};

#[test]
fn the_command_line_reference_is_current() {
    let (code, page, err) = pinset(&["reference"]);
    assert_eq!(code, 0, "{err}");
    let written = std::fs::read_to_string(support::workspace().join("docs/cli.md")).unwrap();
    assert!(
        written == page,
        "docs/cli.md is stale: regenerate it with `pinset reference > docs/cli.md`"
    );
    support::assert_says(
        &page,
        &[
            "## `pinset node`",
            "## `pinset policy push`",
            "## `pinset rollout status`",
        ],
    );
    assert!(
        !page.contains("[env: PINSET_LOG=warn]"),
        "a value of this environment leaked"
    );
}

/// The CRD, metrics and Events references are the code's: regenerated, they are what is written.
#[test]
fn the_crd_metrics_and_events_references_are_current() {
    for (page, file, must) in [
        (
            "crds",
            "docs/reference/crds.md",
            "`spec.pinnedImageSets[].name`",
        ),
        (
            "metrics",
            "docs/reference/metrics.md",
            "`pinset_policy_swaps_total`",
        ),
    ] {
        let (code, text, err) = pinset(&["reference", page]);
        assert_eq!(code, 0, "{err}");
        let written = std::fs::read_to_string(support::workspace().join(file)).unwrap();
        assert!(
            written == text,
            "{file} is stale: regenerate it with `pinset reference {page} > {file}`"
        );
        assert!(text.contains(must), "{must} missing from {file}");
    }
}

#[test]
fn the_readme_is_a_front_page_and_the_book_links_hold() {
    let root = support::workspace();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.lines().count() <= 150,
        "README.md: {} lines",
        readme.lines().count()
    );
    let summary = std::fs::read_to_string(root.join("docs/SUMMARY.md")).unwrap();
    let mut pages = vec![root.join("README.md")];
    for link in links(&summary) {
        let page = root.join("docs").join(&link);
        assert!(
            page.exists(),
            "docs/SUMMARY.md names {link}, which does not exist"
        );
        pages.push(page);
    }
    // Every page of the book is in its table of contents.
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "SUMMARY.md" {
            assert!(
                links(&summary).contains(&name),
                "docs/{name} is not in docs/SUMMARY.md"
            );
        }
    }
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for link in links(&text) {
            let path = link.split('#').next().unwrap();
            if path.is_empty() || link.contains("://") {
                continue;
            }
            assert!(
                dir.join(path).exists(),
                "{}: a link to {link}, which does not exist",
                page.display()
            );
        }
    }
}

#[test]
fn man_pages_cover_every_visible_command_and_its_flags() {
    let dir = tempfile::tempdir().unwrap();
    let man1 = dir.path().join("man1");
    let (code, _, err) = pinset(&["man", man1.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    support::assert_says(&err, &["man pages in"]);
    let page = |name: &str| std::fs::read_to_string(man1.join(name));
    let plan = page("pinset-plan.1").expect("pinset-plan.1");
    support::assert_says(&plan, &[".TH pinset-plan 1"]);
    assert!(
        plan.contains("\\-\\-sets"),
        "the flags are in the page: {plan}"
    );
    let top = page("pinset.1").expect("pinset.1");
    assert!(
        top.contains("pinset\\-plan(1)"),
        "subcommands are listed: {top}"
    );
    assert!(
        page("pinset-policy-test.1").is_ok(),
        "nested commands get a page"
    );
    assert!(
        page("pinset-compile-policy.1").is_err(),
        "hidden commands get none"
    );
}

/// The targets of `[text](target)` links in `markdown`.
fn links(markdown: &str) -> Vec<String> {
    markdown
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|t| !t.contains(' '))
        .map(str::to_string)
        .collect()
}
