/* Loads the drop-in librdmacm (and through it libibverbs and peercm) with dlopen after the
 * program started, as UCX loads its rdmacm module. Libraries loaded so get static TLS only
 * from the loader's small surplus: a library with a large static TLS block fails here with
 * "cannot allocate memory in static TLS block". Run through `peercm exec`. */
#include <dlfcn.h>
#include <stdio.h>

int main(void)
{
	void *cm = dlopen("librdmacm.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!cm) {
		fprintf(stderr, "dlopen librdmacm.so.1: %s\n", dlerror());
		return 1;
	}
	void *(*create_channel)(void) = (void *(*)(void))dlsym(cm, "rdma_create_event_channel");
	void (*destroy_channel)(void *) = (void (*)(void *))dlsym(cm, "rdma_destroy_event_channel");
	if (!create_channel || !destroy_channel) {
		fprintf(stderr, "dlsym: %s\n", dlerror());
		return 1;
	}
	void *channel = create_channel();
	if (!channel) {
		fprintf(stderr, "rdma_create_event_channel failed\n");
		return 1;
	}
	destroy_channel(channel);
	printf("librdmacm.so.1 loaded after start, event channel made\n");
	return 0;
}
