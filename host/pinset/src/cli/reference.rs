//! The command-line reference, from the argument parser itself: every command and subcommand
//! with its flags, defaults and environment variables, as Markdown (`docs/cli.md`, written by
//! the hidden `pinset reference`; a test fails when the page is stale).

/// The page for `root` (pinset's parser).
pub fn markdown(root: clap::Command) -> String {
    // The page says which variable a flag reads, never the value it has where it is generated.
    let mut root = root.mut_args(|a| a.hide_env_values(true)).term_width(100);
    root.build();
    let mut out = String::from(
        "# Command-line reference\n\n\
         Generated from pinset's own argument parser (`pinset reference > docs/cli.md`; a test \
         keeps this page current). Every command also answers `--help`; `pinset completion \
         SHELL` prints a completion script.\n",
    );
    walk(&mut root, "pinset", &mut out);
    out
}

fn walk(cmd: &mut clap::Command, path: &str, out: &mut String) {
    let help = cmd.render_long_help().to_string();
    let help: Vec<&str> = help.lines().map(str::trim_end).collect();
    out.push_str(&format!(
        "\n## `{path}`\n\n```text\n{}\n```\n",
        help.join("\n").trim_end()
    ));
    let names: Vec<String> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .map(|s| s.get_name().to_string())
        .collect();
    for name in names {
        if let Some(sub) = cmd.find_subcommand_mut(&name) {
            walk(sub, &format!("{path} {name}"), out);
        }
    }
}
