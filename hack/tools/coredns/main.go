// CoreDNS with only the plugins the local cluster's Corefile uses (bind,
// errors, cache, kubernetes; hack/nodes.sh), as CoreDNS documents custom
// builds: a fraction of the packages of its full build to compile.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

func init() {
	// Their order of execution, as in CoreDNS' own plugin.cfg.
	if err := dnsserver.SetDirectives([]string{"bind", "errors", "cache", "kubernetes"}); err != nil {
		panic(err)
	}
}

func main() {
	coremain.Run()
}
