//! Rendering the project's Helm charts with the pinned helm, and applying
//! what they render, so tests run with exactly what a chart installs.

use std::path::{Path, PathBuf};

use crate::{Error, LocalCluster};

/// The folder of chart `name` in this repository.
pub fn chart_dir(name: &str) -> PathBuf {
    crate::repo_root().join("charts").join(name)
}

/// How a test in the other lane creating one of the chart's CRDs made a
/// `helm install` fail.
#[derive(Debug, PartialEq, Eq)]
enum CrdRace {
    /// Before Helm's conflict check: it refused, recording nothing.
    BeforeCheck,
    /// After it: Helm's create failed, the release recorded as failed.
    AfterCheck,
}

fn crd_race(failure: &str) -> Option<CrdRace> {
    if failure.contains("cannot be imported into the current release") {
        return Some(CrdRace::BeforeCheck);
    }
    failure
        .lines()
        .any(|line| {
            line.contains("customresourcedefinitions.apiextensions.k8s.io")
                && line.contains("already exists")
        })
        .then_some(CrdRace::AfterCheck)
}

impl LocalCluster {
    /// Builds the charts' dependencies (`hack/charts.sh`: the library chart
    /// into each controller chart, those into the umbrella), once per test
    /// process, so a test renders the charts as they are in the work tree.
    /// Not when `CAIRN_CHARTS_BUILT` is set: hack/test.sh built them before
    /// running test binaries side by side, which must not rewrite the
    /// packaged charts under each other's helm.
    pub async fn build_chart_dependencies(&self) -> Result<(), Error> {
        static BUILT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
        BUILT
            .get_or_try_init(|| async {
                if std::env::var_os("CAIRN_CHARTS_BUILT").is_some() {
                    return Ok(());
                }
                let output =
                    tokio::process::Command::new(crate::repo_root().join("hack/charts.sh"))
                        .arg(self.bin_dir().join("helm"))
                        .output()
                        .await
                        .map_err(|e| Error::Setup(format!("hack/charts.sh: {e}")))?;
                if !output.status.success() {
                    return Err(Error::Setup(format!(
                        "hack/charts.sh failed: {}",
                        String::from_utf8_lossy(&output.stderr)
                    )));
                }
                Ok(())
            })
            .await
            .copied()
    }

    /// Runs the pinned helm against this cluster as the admin, the charts'
    /// dependencies built; returns stdout and stderr, or an error with
    /// stderr if it failed.
    pub async fn helm(&self, args: &[&str]) -> Result<crate::cluster::KubectlOutput, Error> {
        self.build_chart_dependencies().await?;
        let output = tokio::process::Command::new(self.bin_dir().join("helm"))
            .env("KUBECONFIG", self.state_dir().join("kubeconfig"))
            .args(args)
            .output()
            .await
            .map_err(|e| Error::Setup(format!("helm: {e}")))?;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if !output.status.success() {
            return Err(Error::Setup(format!(
                "helm {} failed: {stderr}",
                args.join(" ")
            )));
        }
        Ok(crate::cluster::KubectlOutput {
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr,
        })
    }

    /// `helm template RELEASE charts/CHART --namespace NAMESPACE ARGS…`,
    /// written to a file in the cluster's state folder; returns its path.
    pub async fn helm_template(
        &self,
        chart: &str,
        release: &str,
        namespace: &str,
        args: &[&str],
    ) -> Result<PathBuf, Error> {
        self.build_chart_dependencies().await?;
        let output = tokio::process::Command::new(self.bin_dir().join("helm"))
            .args(["template", release])
            .arg(chart_dir(chart))
            .args(["--namespace", namespace])
            .args(args)
            .output()
            .await
            .map_err(|e| Error::Setup(format!("helm: {e}")))?;
        if !output.status.success() {
            return Err(Error::Setup(format!(
                "helm template {chart} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        let file = self
            .state_dir()
            .join(format!("helm-{namespace}-{release}.yaml"));
        std::fs::write(&file, &output.stdout)
            .map_err(|e| Error::Setup(format!("{}: {e}", file.display())))?;
        Ok(file)
    }

    /// Applies the ServiceAccount and RBAC of controller chart `chart` for
    /// Helm release `release` in `namespace`, watching that namespace only
    /// (value `watchNamespace`), with "mounted" webhook certificates if it
    /// serves a webhook (so no Secret rights for self-managed ones). Returns
    /// the account's name.
    pub async fn install_controller_rbac(
        &self,
        chart: &str,
        release: &str,
        namespace: &str,
    ) -> Result<String, Error> {
        self.install_controller_rbac_watching(chart, release, namespace, namespace)
            .await
    }

    /// [`LocalCluster::install_controller_rbac`] for a release in `namespace`
    /// (its ServiceAccount and Lease) watching another namespace, `watch`, or
    /// every namespace if it is empty (a ClusterRoleBinding: name the release
    /// uniquely).
    pub async fn install_controller_rbac_watching(
        &self,
        chart: &str,
        release: &str,
        namespace: &str,
        watch: &str,
    ) -> Result<String, Error> {
        let watch = format!("watchNamespace={watch}");
        let mut args = vec![
            "--set",
            &watch,
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
        ];
        let values = std::fs::read_to_string(chart_dir(chart).join("values.yaml"))
            .map_err(|e| Error::Setup(format!("values of chart {chart}: {e}")))?;
        if values.lines().any(|l| l.starts_with("webhook:")) {
            args.extend(["--set", "webhook.certificates.secretName=unused"]);
        }
        let file = self.helm_template(chart, release, namespace, &args).await?;
        self.apply_file(&file).await?;
        // The charts' fullname: the release, prefixed unless it names the chart.
        Ok(if release.contains(chart) {
            release.to_owned()
        } else {
            format!("{release}-{chart}")
        })
    }

    /// `helm install RELEASE charts/CHART --namespace NAMESPACE --wait ARGS…`
    /// with the pinned helm, as a user installs a controller. Unless `args`
    /// set `crds.install=false`, the chart's CRDs may exist already (the
    /// tests install them): they are handed to the release first, as Helm
    /// requires to adopt an object. A test running in another lane can
    /// create one between that and the install: before Helm's conflict
    /// check, Helm refuses it and the install is retried once it is adopted;
    /// after it, the create fails and the failed release is uninstalled
    /// before the retry.
    pub async fn helm_install(
        &self,
        chart: &str,
        release: &str,
        namespace: &str,
        args: &[&str],
    ) -> Result<(), Error> {
        let chart_path = chart_dir(chart).to_string_lossy().into_owned();
        let mut install = vec!["install", release, chart_path.as_str()];
        install.extend(["--namespace", namespace, "--wait", "--timeout", "3m"]);
        install.extend(args);
        // A release with `crds.install=false` renders no CRD: the installed
        // ones, and whichever release they belong to, stay as they are.
        let installs_crds = !args.contains(&"crds.install=false");
        let mut attempts = 0;
        loop {
            attempts += 1;
            if installs_crds {
                self.hand_crds_to_release(chart, release, namespace).await?;
            }
            let failure = match self.helm(&install).await {
                Ok(_) => return Ok(()),
                Err(Error::Setup(failure)) if attempts < 3 => failure,
                Err(e) => return Err(e),
            };
            match crd_race(&failure) {
                Some(CrdRace::BeforeCheck) => {}
                // Helm recorded the release as failed, which must go before
                // the name can be used again (the CRDs stay:
                // `helm.sh/resource-policy: keep`).
                Some(CrdRace::AfterCheck) => {
                    self.helm(&["uninstall", release, "--namespace", namespace, "--wait"])
                        .await?;
                }
                None => return Err(Error::Setup(failure)),
            }
        }
    }

    /// Gives each of the chart's CRDs that exists the ownership labels and
    /// annotations of `release`, and no conversion webhook.
    async fn hand_crds_to_release(
        &self,
        chart: &str,
        release: &str,
        namespace: &str,
    ) -> Result<(), Error> {
        let crds = chart_dir(chart).join("templates/crds");
        let entries = std::fs::read_dir(&crds)
            .map_err(|e| Error::Setup(format!("{}: {e}", crds.display())))?;
        for entry in entries {
            let path = entry.map_err(|e| Error::Setup(e.to_string()))?.path();
            let Some(name) = path.file_stem().and_then(|n| n.to_str()) else {
                continue;
            };
            let crd = format!("crd/{name}");
            if self
                .kubectl(&["get", &crd, "--ignore-not-found", "-o", "name"])
                .await?
                .stdout
                .trim()
                .is_empty()
            {
                continue;
            }
            let release_name = format!("meta.helm.sh/release-name={release}");
            let release_namespace = format!("meta.helm.sh/release-namespace={namespace}");
            self.kubectl(&[
                "annotate",
                "--overwrite",
                &crd,
                &release_name,
                &release_namespace,
            ])
            .await?;
            self.kubectl(&[
                "label",
                "--overwrite",
                &crd,
                "app.kubernetes.io/managed-by=Helm",
            ])
            .await?;
            // A conversion webhook set by a test (a url) would survive Helm's
            // merge beside the chart's Service, which the API server rejects.
            let no_conversion =
                r#"[{"op":"replace","path":"/spec/conversion","value":{"strategy":"None"}}]"#;
            self.kubectl(&["patch", &crd, "--type=json", "-p", no_conversion])
                .await?;
        }
        Ok(())
    }

    /// Server-side applies the objects in `file` (as the admin).
    pub async fn apply_file(&self, file: &Path) -> Result<(), Error> {
        self.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &file.to_string_lossy(),
        ])
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_crd_created_meanwhile_is_a_lost_race() {
        let after = "Error: INSTALLATION FAILED: 1 error occurred:\n\t* customresourcedefinitions.apiextensions.k8s.io \"databaseclusters.database.cairn.dev\" already exists\n";
        assert_eq!(crd_race(after), Some(CrdRace::AfterCheck));
        let before = "Error: INSTALLATION FAILED: Unable to continue with install: CustomResourceDefinition \"databaseclusters.database.cairn.dev\" in namespace \"\" exists and cannot be imported into the current release: invalid ownership metadata";
        assert_eq!(crd_race(before), Some(CrdRace::BeforeCheck));
        assert_eq!(
            crd_race("Error: INSTALLATION FAILED: services \"x\" already exists"),
            None
        );
        assert_eq!(
            crd_race("Error: INSTALLATION FAILED: context deadline exceeded"),
            None
        );
    }
}
