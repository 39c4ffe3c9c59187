//! `bitmend generate`: man pages and shell completions, made from the command-line
//! definitions themselves, so that they never say other than `--help` does.

use std::path::PathBuf;

use clap::{Args, CommandFactory, Subcommand};
use clap_complete::Shell;

use crate::error::CliError;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// Write a man page for bitmend and one for each subcommand (bitmend-mkfs.1, ...) into DIR.
    Man {
        /// Where the pages go (made if missing), e.g. /usr/local/share/man/man1.
        dir: PathBuf,
    },
    /// Print the completion script of SHELL on stdout (bash, zsh, fish, elvish, powershell).
    Completions { shell: Shell },
}

pub fn run(a: GenerateArgs) -> Result<(), CliError> {
    let mut cmd = crate::Cli::command();
    match a.what {
        What::Completions { shell } => {
            clap_complete::generate(shell, &mut cmd, "bitmend", &mut std::io::stdout());
            Ok(())
        }
        What::Man { dir } => {
            let fail = |e: std::io::Error| CliError::Failed(format!("{}: {e}", dir.display()));
            std::fs::create_dir_all(&dir).map_err(fail)?;
            cmd.build();
            let mut pages = vec![("bitmend".to_string(), cmd.clone())];
            pages.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help").map(
                |s| {
                    let name = format!("bitmend-{}", s.get_name());
                    (name.clone(), s.clone().name(name))
                },
            ));
            for (name, page) in &pages {
                let mut out = Vec::new();
                clap_mangen::Man::new(page.clone()).render(&mut out).map_err(fail)?;
                std::fs::write(dir.join(format!("{name}.1")), out).map_err(fail)?;
            }
            println!("{} man pages in {}", pages.len(), dir.display());
            Ok(())
        }
    }
}
