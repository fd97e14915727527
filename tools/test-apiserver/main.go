// sluice-test-apiserver: k8s.io/apiextensions-apiserver (a CRD-only Kubernetes API
// server backed by etcd) plus the two things the stock binary lacks for tests that use
// kubectl, helm or kube-rs discovery:
//
//   - root discovery: GET /apis (plain APIGroupList and aggregated discovery v2), and a
//     core group with no resources (GET /api lists v1, GET /api/v1 lists nothing). The
//     stock binary leaves /apis to kube-aggregator, so it answers 404 there and every
//     kubectl command that needs discovery fails; kube-rs's Discovery::run() fails on
//     a missing or empty /api.
//   - OpenAPI v2 (and the CRD OpenAPI controllers that publish the CRDs' schemas), as
//     upstream's own test server sets it, so `kubectl explain` and client-side
//     validation know the custom kinds.
//
// It takes exactly the flags of the stock apiextensions-apiserver.
// Built by scripts/install-kube.sh; see docs/kubernetes-testing.md.
package main

import (
	"context"
	"net/http"
	"os"
	"sort"
	"sync/atomic"

	"github.com/spf13/cobra"

	apiextensionshelpers "k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver"
	listers "k8s.io/apiextensions-apiserver/pkg/client/listers/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/cmd/server/options"
	generatedopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	discoveryaggregated "k8s.io/apiserver/pkg/endpoints/discovery/aggregated"
	"k8s.io/apiserver/pkg/endpoints/handlers/negotiation"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/util/openapi"
	"k8s.io/component-base/cli"
)

func main() {
	ctx := genericapiserver.SetupSignalContext()
	o := options.NewCustomResourceDefinitionsServerOptions(os.Stdout, os.Stderr)
	cmd := &cobra.Command{
		Use:   "sluice-test-apiserver",
		Short: "CRD-only Kubernetes API server for tests (apiextensions-apiserver + root discovery)",
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return o.ServerRunOptions.ComponentGlobalsRegistry.Set()
		},
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return run(c.Context(), o)
		},
	}
	cmd.SetContext(ctx)
	o.AddFlags(cmd.Flags())
	os.Exit(cli.Run(cmd))
}

func run(ctx context.Context, o *options.CustomResourceDefinitionsServerOptions) error {
	config, err := o.Config()
	if err != nil {
		return err
	}
	defs := openapi.GetOpenAPIDefinitionsWithoutDisabledFeatures(generatedopenapi.GetOpenAPIDefinitions)
	config.GenericConfig.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(defs, openapinamer.NewDefinitionNamer(apiserver.Scheme))

	// The CRD handler passes every request it does not serve itself (among them /apis
	// and /api) to its delegate; ours answers discovery once the server exists.
	var disc atomic.Pointer[rootDiscovery]
	delegate := genericapiserver.NewEmptyDelegateWithCustomHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d := disc.Load(); d != nil {
			d.ServeHTTP(w, r)
			return
		}
		http.NotFound(w, r)
	}))

	server, err := config.Complete().New(delegate)
	if err != nil {
		return err
	}
	gs := server.GenericAPIServer
	d := &rootDiscovery{crds: server.Informers.Apiextensions().V1().CustomResourceDefinitions().Lister()}
	d.apis = discoveryaggregated.WrapAggregatedDiscoveryToHandler(http.HandlerFunc(d.serveAPIGroupList), gs.AggregatedDiscoveryGroupManager)
	d.api = discoveryaggregated.WrapAggregatedDiscoveryToHandler(http.HandlerFunc(d.serveAPIVersions), gs.AggregatedLegacyDiscoveryGroupManager)
	disc.Store(d)
	// Make sure the CRD informer (the lister's source) is started and synced.
	server.Informers.Apiextensions().V1().CustomResourceDefinitions().Informer()

	return gs.PrepareRun().RunWithContext(ctx)
}

type rootDiscovery struct {
	crds listers.CustomResourceDefinitionLister
	apis http.Handler
	api  http.Handler
}

func (d *rootDiscovery) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/apis", "/apis/":
		d.apis.ServeHTTP(w, r)
	case "/api", "/api/":
		d.api.ServeHTTP(w, r)
	case "/api/v1", "/api/v1/":
		responsewriters.WriteObjectNegotiated(apiserver.Codecs, negotiation.DefaultEndpointRestrictions, schema.GroupVersion{}, w, r, http.StatusOK,
			&metav1.APIResourceList{GroupVersion: "v1", APIResources: []metav1.APIResource{}}, false)
	default:
		http.NotFound(w, r)
	}
}

// serveAPIVersions: there are no core resources here, but clients that always read
// /api (kube-rs Discovery::run, kubectl without aggregated discovery) need a 200 with
// at least one version, so core v1 is listed and /api/v1 holds no resources. (The
// aggregated form, asked for by kubectl >= 1.30, is an empty list.)
func (d *rootDiscovery) serveAPIVersions(w http.ResponseWriter, r *http.Request) {
	responsewriters.WriteObjectNegotiated(apiserver.Codecs, negotiation.DefaultEndpointRestrictions, schema.GroupVersion{}, w, r, http.StatusOK,
		&metav1.APIVersions{Versions: []string{"v1"}, ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{{ClientCIDR: "0.0.0.0/0", ServerAddress: r.Host}}}, false)
}

// serveAPIGroupList: apiextensions.k8s.io plus the groups of all established CRDs,
// versions in Kubernetes priority order (the first is the preferred one).
func (d *rootDiscovery) serveAPIGroupList(w http.ResponseWriter, r *http.Request) {
	crds, err := d.crds.List(labels.Everything())
	if err != nil {
		responsewriters.InternalError(w, r, err)
		return
	}
	versionsByGroup := map[string]map[string]bool{}
	for _, crd := range crds {
		if !apiextensionshelpers.IsCRDConditionTrue(crd, apiextensionsv1.Established) {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			if versionsByGroup[crd.Spec.Group] == nil {
				versionsByGroup[crd.Spec.Group] = map[string]bool{}
			}
			versionsByGroup[crd.Spec.Group][v.Name] = true
		}
	}
	groupNames := make([]string, 0, len(versionsByGroup))
	for g := range versionsByGroup {
		groupNames = append(groupNames, g)
	}
	sort.Strings(groupNames)

	list := &metav1.APIGroupList{Groups: []metav1.APIGroup{apiGroup(apiextensionsv1.GroupName, []string{"v1"})}}
	for _, g := range groupNames {
		if g == apiextensionsv1.GroupName {
			continue
		}
		vs := make([]string, 0, len(versionsByGroup[g]))
		for v := range versionsByGroup[g] {
			vs = append(vs, v)
		}
		sort.Slice(vs, func(i, j int) bool { return version.CompareKubeAwareVersionStrings(vs[i], vs[j]) > 0 })
		list.Groups = append(list.Groups, apiGroup(g, vs))
	}
	responsewriters.WriteObjectNegotiated(apiserver.Codecs, negotiation.DefaultEndpointRestrictions, schema.GroupVersion{}, w, r, http.StatusOK, list, false)
}

func apiGroup(name string, versions []string) metav1.APIGroup {
	g := metav1.APIGroup{Name: name}
	for _, v := range versions {
		g.Versions = append(g.Versions, metav1.GroupVersionForDiscovery{GroupVersion: name + "/" + v, Version: v})
	}
	g.PreferredVersion = g.Versions[0]
	return g
}
